"""The plans colauto would choose at 100/75/50% of the activation memory, on this CPU, for a bench.run model
at its GPU bench shape: bf16 autocast (CPU), codegen inductor, the h200 device preset, as bench.remat_sweep
budgets them (parameters, gradients and optimizer state plus that share of the activation memory the profile
predicts with no budget). Nothing runs the model: each plan is explain()'s. To compare two versions of the
code, run it with PYTHONPATH= each checkout.

    python bench/sessions/plan_points.py gpt2:124m:16:1024 100,75,50
    PYTHONPATH=/path/to/older/checkout python bench/sessions/plan_points.py hf/qwen2:bench:8:1024 100,75,50
"""
import os
import sys
import time
import warnings

os.environ["COLAUTO_PLAN_CACHE"] = "0"
warnings.filterwarnings("ignore")
sys.path.insert(0, os.environ.get("PYTHONPATH", "").split(":")[0] or os.getcwd())

import torch  # noqa: E402

import colauto_backend  # noqa: E402
from bench.run import build_model, parse_models  # noqa: E402


def main() -> None:
    spec = parse_models(sys.argv[1])[0]
    points = [float(p) for p in (sys.argv[2] if len(sys.argv) > 2 else "100,75,50").split(",")]
    model, make_inputs, _ = build_model(spec, "cpu")
    inputs = make_inputs(spec["batch"], spec["seq"])
    call = dict(kwargs=inputs[0]) if spec["model"].startswith("hf/") else {}
    args = () if call else inputs
    options = {"codegen": "inductor", "device": "h200"}
    with torch.autocast("cpu", torch.bfloat16):
        prof = colauto_backend.profile(model, *args, **call, options=dict(options, memory_budget="none"))
        d = prof.details
        held = d["param_bytes"] + d["grad_bytes"] + d["optimizer_state_bytes"]
        activations = prof.peak_memory_bytes - held
        print(f"{sys.argv[1]}: unplanned peak {prof.peak_memory_bytes / 2**30:.3f} GiB, "
              f"step {prof.est_step_time_s * 1e3:.3f} ms (modeled)")
        for p in points:
            budget = int(held + p / 100 * activations)
            start = time.perf_counter()
            try:
                plan = colauto_backend.explain(model, *args, **call, budget=budget, options=options)
            except colauto_backend.BudgetError as err:
                print(f"  {p:g}%: budget {budget / 2**30:.3f} GiB: BudgetError, least peak "
                      f"{err.smallest_bytes / 2**30:.3f} GiB")
                continue
            print(f"  {p:g}%: budget {budget / 2**30:.3f} GiB: peak {plan.peak_with_bytes / 2**30:.3f} GiB, "
                  f"step {plan.step_time_with_s * 1e3:.3f} ms, recompute {plan.recompute_time_s * 1e3:.3f} ms, "
                  f"{plan.partitions_run} partitions, {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
