"""The remat planner at several budgets of one HF model, on this machine's CPU (no GPU): each plan's
predicted step time and peak, the real partitions it ran, and its planning time; with --exhaustive, the
plans of partitioning every candidate of the 12-point grid beside them.

    python -m bench.plan_check --model qwen2 --layers 8 --batch 4 --seq 1024 --exhaustive
    python -m bench.plan_check --model qwen2 --layers 0 --batch 4 --seq 64     # the tiny test config

--layers N > 0 takes the model's `bench` shape with N layers (0: the tiny config). Plans are made under
Inductor codegen for an H100 preset at 90/60/30/0% of the range from the least feasible budget to the
unplanned peak, each from a cold planner cache (the same capture)."""
import argparse
import os
import sys
import time

os.environ["COLAUTO_PLAN_CACHE"] = "0"   # plan, don't read a stored plan

import torch  # noqa: E402

import colauto_backend  # noqa: E402
from colauto_backend import planner as planner_mod  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--exhaustive", action="store_true")
    args = ap.parse_args()
    import transformers
    from examples.hf_zoo import SPECS, config_of
    config = config_of(args.model, "bench" if args.layers else "tiny")
    if args.layers:
        config.num_hidden_layers = args.layers
    torch.manual_seed(0)
    model = getattr(transformers, SPECS[args.model].model)(config)
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq))
    colauto_backend.explain(model, kwargs={"input_ids": ids, "labels": ids}, budget="none",
                            options={"codegen": "inductor"}, device="h100")
    fast = sys.modules["colauto_backend.profile"]._CAPTURES[model][1].planner
    hi = fast.base["peak_memory_bytes"]
    try:
        fast.plan(1024)
        raise SystemExit("a 1 KiB budget was met: nothing to plan")
    except colauto_backend.BudgetError as e:
        lo = e.smallest_bytes
    print(f"least feasible {lo / 2**20:.1f} MiB, unplanned {hi / 2**20:.1f} MiB")
    slow = planner_mod.Planner(fast.joint, fast.partition, fast.baseline, fast.analysis_for, fast.buffers)
    for f in (0.9, 0.6, 0.3, 0.0):
        budget = int(lo + f * (hi - lo))
        fast._simulated.clear(), fast._modeled.clear(), fast._times.clear()
        start = time.perf_counter()
        p = fast.plan(budget)[0]
        line = (f"{f:.0%} of the range: {p.step_time_with_s * 1e3:.2f} ms, peak {p.peak_with_bytes / 2**20:.1f} MiB, "
                f"{p.partitions_run} partitions, {time.perf_counter() - start:.1f} s")
        if args.exhaustive:
            try:
                ref = slow.plan(budget)[0]
                line += f"; exhaustive {ref.step_time_with_s * 1e3:.2f} ms, peak {ref.peak_with_bytes / 2**20:.1f} MiB"
            except colauto_backend.BudgetError:
                line += "; exhaustive: nothing fits"
        print(line)


if __name__ == "__main__":
    main()
