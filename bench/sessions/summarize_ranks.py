"""One line per run of a tests/ranks/hf_worker.py launch folder (rank*.json): pass when every rank's losses equal
the reference's within 1e-5, its parameters within 1e-4, and the ranks hold the same parameters (the checks of
bench/parallel_matrix.py); with the tp route counters.

    python bench/sessions/summarize_ranks.py OUT
"""
import json, sys, glob
out = sys.argv[1]
ranks = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/rank*.json"))]
for i, r0 in enumerate(ranks[0]):
    per = [rk[i] for rk in ranks]
    err = next((r["error"] for r in per if r["error"]), None)
    if err:
        print(f"{r0['run']:32s} FAIL {err.splitlines()[0][:220]}"); continue
    worst = max(max(abs(a - b) for a, b in zip(r["losses"], r["ref_losses"])) for r in per)
    pd = max(r["max_param_diff"] for r in per)
    same = len({r["param_sum"] for r in per}) == 1
    ok = worst <= 1e-5 and pd <= 1e-4 and same
    print(f"{r0['run']:32s} {'pass' if ok else 'FAIL'} loss {worst:.1e} param {pd:.1e} ranks_equal={same} lifted={r0.get('tp_lifted')} notlifted={r0.get('tp_not_lifted')} repl={r0.get('tp_run_replicated')} strided={r0.get('tp_strided_views_gathered')}")
