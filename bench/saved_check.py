"""Check the memory model, phase by phase, on compiled training steps.

    python -m bench.saved_check --models gpt2:124m:16:1024 --budgets inductor,6GiB --out DIR

For each budget ("inductor": torch.compile's default backend, whose min-cut partition is colauto's
unbudgeted one; otherwise colauto with Inductor codegen and that COLAUTO_MEMORY_BUDGET) it measures
over one steady-state step: the storages the compiled forward saves for backward
(torch.autograd.graph.saved_tensors_hooks, parameters excluded), memory allocated after forward,
and the step's peak; beside them, colauto's prediction for the same partition. Writes check.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import colauto_backend
from colauto_backend import config, graph
from colauto_backend.backend import ANALYSES, make_backend
from bench.run import GiB, autocast, environment, parse_models, make_optimizer
from examples.models import build


def measure(model, fn, x, targets, args) -> dict:
    opt = make_optimizer(model, args.device)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def step(seen: dict):
        with torch.autograd.graph.saved_tensors_hooks(lambda t: _pack(t, seen, params), lambda t: t), autocast(args):
            loss = fn(x, targets)
        after_fwd = torch.cuda.memory_allocated()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return after_fwd

    for _ in range(3):
        step({})
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    saved: dict = {}
    after_fwd = step(saved)
    torch.cuda.synchronize()
    return dict(measured_saved_bytes=sum(saved.values()), measured_after_forward_bytes=after_fwd,
                measured_peak_bytes=torch.cuda.max_memory_allocated())


def predicted(analysis) -> dict:
    """The prediction for the partition an analysis describes."""
    ev = analysis.evaluate(analysis.hints)
    values = analysis.basis.values(analysis.hints)
    last_fwd = max(i for i, label in enumerate(analysis.timeline.labels) if label.startswith("fwd:"))
    by_op: dict[str, float] = {}
    for name, expr in analysis.timeline.saved_nodes:
        key = name.rstrip("0123456789_")
        by_op[key] = round(by_op.get(key, 0) + float(graph.value_at(expr, analysis.hints)) / GiB, 3)
    return dict(predicted_saved_bytes=ev["saved_activation_bytes"], predicted_peak_bytes=ev["peak_memory_bytes"],
                predicted_peak_at=ev["peak_at"], predicted_step_s=ev["est_step_time_s"],
                predicted_after_forward_bytes=int(analysis.timeline.rows[last_fwd] @ values),
                predicted_saved_gib_by_op=by_op)


def _pack(t, seen: dict, params: set):
    s = t.untyped_storage()
    if s.data_ptr() not in params:
        seen[s.data_ptr()] = s.nbytes()
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=parse_models, default=parse_models("gpt2:124m:16:1024"))
    ap.add_argument("--budgets", default="inductor")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    args.device, args.dtype, args.steps, args.warmup = "cuda", "bf16", 1, 3
    rows = []
    for spec in args.models:
        model, make_inputs = build(spec["model"], spec["size"], device=args.device)
        x, targets = make_inputs(spec["batch"], spec["seq"])
        for budget in args.budgets.split(","):
            torch._dynamo.reset()
            options = {"codegen": "inductor", "memory_budget": "none" if budget == "inductor" else budget}
            colauto = torch.compile(model, backend=make_backend(config.load(options)))
            with autocast(args):   # colauto's analysis of this partition (and plan, under a budget)
                colauto(x, targets)
            analysis = ANALYSES[-1]
            row = dict(spec, budget=budget, **predicted(analysis))
            fn = torch.compile(model) if budget == "inductor" else colauto
            row.update(measure(model, fn, x, targets, args))
            rows.append(row)
            print({k: (round(v / GiB, 3) if isinstance(v, int) and v > 2**20 else v) for k, v in row.items()},
                  flush=True)
        del model
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "check.json").write_text(json.dumps(dict(environment=environment(args, [], prog="bench.saved_check"), rows=rows), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
