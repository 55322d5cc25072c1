"""Command line: `python -m colauto_backend explain ...` plans a model of the example zoo without running it.

    python -m colauto_backend explain --model gpt2:1.5b --batch 8 --seq 1024 --mesh 2x4 --device h100
    python -m colauto_backend explain --model llama:1b --batch 4 --seq 2048 --budget 40GiB

Without --mesh it prints the single-device rematerialization plan; with it, the parallel plan for that
many devices (this machine need not have them). --batch is one rank's micro-batch. Run it from the
repository root (the models live in examples/models.py).
"""
from __future__ import annotations

import argparse
import json
import sys

import torch


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m colauto_backend", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("explain", help="print the plan for a model of examples/models.py")
    ex.add_argument("--model", default="gpt2:124m", help="NAME:SIZE, e.g. gpt2:1.5b, llama:1b")
    ex.add_argument("--batch", type=int, default=8, help="micro-batch per rank")
    ex.add_argument("--seq", type=int, default=1024)
    ex.add_argument("--mesh", default=None, help="COLAUTO_MESH form: 8, 2x4, fsdp=2,tp=4, or auto with --devices")
    ex.add_argument("--devices", type=int, default=None, help="with --mesh auto: plan over every mesh of N devices")
    ex.add_argument("--device", default="h100", help="roofline preset: h100, h200, a100, cpu")
    ex.add_argument("--budget", default=None, help="memory per device: 40GiB, 0.5, none")
    ex.add_argument("--comm", default=None, help="interconnect preset or calibration JSON")
    ex.add_argument("--json", action="store_true", help="print the plan as JSON")
    args = ap.parse_args(argv)

    try:
        from examples.models import build
    except ImportError:
        sys.exit("colauto explain: examples/models.py is not importable: run from the repository root")
    import colauto_backend
    from colauto_backend import report

    name, _, size = args.model.partition(":")
    with torch.device("meta"):          # no weights in memory: capture reads no values
        model, make = build(name, size or "tiny")
    model = model.to_empty(device="cpu")
    inputs = tuple(torch.zeros(t.shape, dtype=t.dtype) for t in make(args.batch, args.seq))   # sizes only
    options = {"comm": args.comm} if args.comm else None
    try:
        plan = colauto_backend.explain(model, *inputs, budget=args.budget, mesh=args.mesh, device=args.device,
                                       devices=args.devices, options=options)
    except (colauto_backend.ConfigError, colauto_backend.BudgetError) as exc:
        sys.exit(f"colauto explain: {exc}")
    if args.mesh is None:
        print(json.dumps(plan.to_dict(), indent=1) if args.json else _remat_lines(plan))
    else:
        print(json.dumps(plan.to_json(), indent=1, default=str) if args.json else report.render_parallel(plan.to_json()))


def _remat_lines(plan) -> str:
    from colauto_backend.report import _plan_lines
    return "\n".join(_plan_lines(plan.to_dict()))


if __name__ == "__main__":
    main()
