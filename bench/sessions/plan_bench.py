"""By hand (session 26): colauto's planning of an HF model at its bench shape, on this machine's CPU,
without running the model: the capture is explain()'s (fake activations, bf16 parameters on the CPU).

    COLAUTO_PLAN_CACHE=0 python bench/sessions/plan_bench.py llama 0.3

The budget is the least peak colauto can reach plus FRACTION (default 0.3) of the way to the unplanned
peak, at B4 x T1024, codegen inductor. Prints the modeled plan's time (explain) and then the time of the
planner as the compile path runs it (modeled candidates, then the chosen plan's real min-cut partition).
"""
import importlib
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import colauto_backend  # noqa: E402
from examples import hf_zoo  # noqa: E402

profile_mod = importlib.import_module("colauto_backend.profile")   # the module, not the function it exports
OPTIONS = {"codegen": "inductor"}


def main(name: str, fraction: float) -> None:
    model, make = hf_zoo.build_hf(name, "bench", dtype=torch.bfloat16)
    batch = make(4, 1024)
    unplanned = colauto_backend.explain(model, kwargs=batch, options=OPTIONS)
    try:
        colauto_backend.explain(model, kwargs=batch, budget="1MB", options=OPTIONS)
        raise SystemExit("plan_bench: 1 MB fitted; nothing to plan")
    except colauto_backend.BudgetError as exc:
        least = exc.smallest_bytes
    budget = int(least + fraction * (unplanned.peak_without_bytes - least))
    start = time.perf_counter()
    modeled = colauto_backend.explain(model, kwargs=batch, budget=budget, options=OPTIONS)
    print(f"{name}: budget {budget} bytes (unplanned peak {unplanned.peak_without_bytes}, least {least}); "
          f"modeled plan (explain) {time.perf_counter() - start:.2f} s, peak {modeled.peak_with_bytes}")
    model, _ = hf_zoo.build_hf(name, "bench", dtype=torch.bfloat16)     # a fresh capture: nothing planned yet
    analysis = profile_mod._captured(model, (), OPTIONS, batch)
    start = time.perf_counter()
    plan, _, chosen = analysis.planner.plan(budget)
    print(f"{name}: the compile path's planning {time.perf_counter() - start:.2f} s, peak {plan.peak_with_bytes}, "
          f"{len(chosen.recomputed or ())} nodes recomputed")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "llama", float(sys.argv[2]) if len(sys.argv) > 2 else 0.3)
