"""By hand (session 27): the compile path's planning of an HF model at its bench shape on this machine's CPU,
with the number of candidates whose modeled peak was replayed (the liveness pass `Planner._peak` runs).

    python bench/sessions/plan_replays.py llama 0.81,0.9

Each FRACTION is a budget of that share of the unplanned modeled peak (B4 x T1024, bf16, codegen inductor,
captured as explain() does: fake activations, no model run). Prints the planning time, the replays, and the
chosen plan's peak and recompute time, so two checkouts can be compared on the same machine:
`PYTHONPATH=/path/to/other/checkout python bench/sessions/plan_replays.py ...`.
"""
import importlib
import os
import sys
import time

os.environ["COLAUTO_PLAN_CACHE"] = "0"
if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torch  # noqa: E402
from examples import hf_zoo  # noqa: E402

profile_mod = importlib.import_module("colauto_backend.profile")   # the module, not the function it exports


def main(name: str, fractions: list[float]) -> None:
    for frac in fractions:
        model, make = hf_zoo.build_hf(name, "bench", dtype=torch.bfloat16)   # a fresh capture each time
        planner = profile_mod._captured(model, (), {"codegen": "inductor"}, make(4, 1024)).planner
        replays, predict = [0], planner.predict

        def counted(tags, replay=True):
            replays[0] += replay
            return predict(tags, replay=replay)
        planner.predict = counted
        budget = int(frac * planner.base["peak_memory_bytes"] / (1 - 0.005))   # 0.5%: the planner's headroom
        start = time.perf_counter()
        plan, _, _ = planner.plan(budget)
        print(f"{profile_mod.__file__.rsplit('/colauto_backend', 1)[0]}: {name} at {frac} of its peak: planned in "
              f"{time.perf_counter() - start:.2f} s, {replays[0]} modeled peaks replayed, peak {plan.peak_with_bytes}, "
              f"recompute {plan.recompute_time_s * 1e3:.3f} ms, {plan.partitions_run} real partitions", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "llama",
         [float(f) for f in (sys.argv[2] if len(sys.argv) > 2 else "0.81").split(",")])
