"""Check the memory model on the partition torch.compile's default backend makes.

    python -m bench.saved_check --model gpt2:124m:16:1024 --out DIR

Compiles the model with torch.compile (Inductor, min-cut partition) and measures, over one step:
the storages the compiled forward saves for backward (torch.autograd.graph.saved_tensors_hooks,
parameters excluded), memory allocated after forward, and the step's peak. Beside them: colauto's
prediction for the same partition (Inductor codegen, no budget). Writes check.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import colauto_backend
from colauto_backend import graph
from bench.run import GiB, autocast, environment, parse_models, make_optimizer
from examples.models import build


def measure(model, x, targets, args) -> dict:
    opt = make_optimizer(model, args.device)
    fn = torch.compile(model)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def step(hook: dict | None = None):
        ctx = torch.autograd.graph.saved_tensors_hooks(lambda t: _pack(t, hook, params), lambda t: t) \
            if hook is not None else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
        with ctx, autocast(args):
            loss = fn(x, targets)
        after_fwd = torch.cuda.memory_allocated()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return after_fwd

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    saved: dict = {}
    after_fwd = step(saved)
    torch.cuda.synchronize()
    return dict(measured_saved_bytes=sum(saved.values()), measured_after_forward_bytes=after_fwd,
                measured_before_step_bytes=base, measured_peak_bytes=torch.cuda.max_memory_allocated(),
                saved_storages=len(saved))


def _pack(t, seen: dict, params: set):
    s = t.untyped_storage()
    if s.data_ptr() not in params:
        seen[s.data_ptr()] = s.nbytes()
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=parse_models, default=parse_models("gpt2:124m:16:1024"))
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    args.device, args.dtype, args.steps, args.warmup = "cuda", "bf16", 1, 3
    rows = []
    for spec in args.models:
        model, make_inputs = build(spec["model"], spec["size"], device=args.device)
        x, targets = make_inputs(spec["batch"], spec["seq"])
        with autocast(args):
            prof = colauto_backend.profile(model, x, targets, options={"codegen": "inductor", "memory_budget": "none"})
        d = prof.details
        analysis = prof._analysis
        values = analysis.basis.values(analysis.hints)
        last_fwd = max(i for i, label in enumerate(analysis.timeline.labels) if label.startswith("fwd:"))
        by_op: dict[str, float] = {}
        for name, expr in analysis.timeline.saved_nodes:
            key = name.rstrip("0123456789_")
            by_op[key] = by_op.get(key, 0) + round(float(graph.value_at(expr, analysis.hints)) / GiB, 3)
        torch._dynamo.reset()
        row = dict(spec, predicted_saved_bytes=prof.saved_activation_bytes, predicted_peak_bytes=prof.peak_memory_bytes,
                   predicted_peak_at=d.get("peak_at"),
                   predicted_after_forward_bytes=int(analysis.timeline.rows[last_fwd] @ values),
                   predicted_saved_gib_by_op=by_op, persistent_bytes=d["param_bytes"] + d["optimizer_state_bytes"])
        row.update(measure(model, x, targets, args))
        rows.append(row)
        print({k: (round(v / GiB, 3) if isinstance(v, int) and v > 2**20 else v) for k, v in row.items()}, flush=True)
        del model
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "check.json").write_text(json.dumps(dict(environment=environment(args, []), rows=rows), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
