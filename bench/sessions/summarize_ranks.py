"""One line per run of a tests/ranks/hf_worker.py launch folder (rank*.json): bench/parallel_matrix.py's verdict
(every rank's losses within 1e-5 of the reference's, its parameters within 1e-4, the ranks holding the same
parameters), the worst differences, and the tp route counters.

    python bench/sessions/summarize_ranks.py OUT
"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench.parallel_matrix import verdict  # noqa: E402


def main(out: str) -> None:
    ranks = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/rank*.json"))]
    for i, first in enumerate(ranks[0]):
        per = [rank[i] for rank in ranks]
        state, why = verdict(per)
        if any(r["error"] for r in per):
            print(f"{first['run']:32s} FAIL {why[:220]}")
            continue
        worst = max(max(abs(a - b) for a, b in zip(r["losses"], r["ref_losses"])) for r in per)
        print(f"{first['run']:32s} {'pass' if state == 'pass' else 'FAIL'} loss {worst:.1e} "
              f"param {max(r['max_param_diff'] for r in per):.1e} "
              f"ranks_equal={len({r['param_sum'] for r in per}) == 1} lifted={first.get('tp_lifted')} "
              f"notlifted={first.get('tp_not_lifted')} repl={first.get('tp_run_replicated')} "
              f"strided={first.get('tp_strided_views_gathered')}")


if __name__ == "__main__":
    main(sys.argv[1])
