"""Where colauto's predicted step goes, by kind of kernel: matmuls, fused attention, memory-bound ops
(after Inductor's fusion), the optimizer. With --against, beside the GPU profile of a committed
`bench.dist_compare --profile` result (its `profile` fields), to see which part of a prediction is off.

    python -m bench.predicted_breakdown --model hf/llama:bench --batch 4 --seq 1024 --device h200 \\
        --against bench/results/h200x2-2026-11-28-dp-overlap/json/hf-llama-bench-2gpu-colauto.json

Runs on this machine's CPU (no GPU): the model is captured at a small size with dynamic shapes (every
graph, graph breaks included, run eagerly in fp32 under bf16 autocast, as the GPU runs it), and each
graph's cost model is evaluated at --batch x --seq on the device preset, as Inductor's code (codegen
inductor: fused intermediates cost nothing). One device's graphs: no collectives, which is a data-parallel
plan's per-GPU compute. The measured side: the profiled step's GEMM and attention kernels, the fused
optimizer's kernels (multi_tensor_apply) and the rest of the non-NCCL kernels.

A model whose attention this CPU runs as explicit matmuls and softmax where a GPU runs a fused kernel
(attention dropout in training: HF GPT-2) does not have the GPU's graphs: with no fused attention in its
graphs and batched matmuls present, the output says so in a CAUTION line.
"""
import argparse
import json
import sys

import torch

from colauto_backend import config as cfg
from colauto_backend.backend import analyze_only

CAPTURE_BATCH, CAPTURE_SEQ = 3, 64       # distinct hints: a size symbol is the batch or the sequence


def kind_of(node, attention: bool) -> str:
    """`attention`: the cost table's mark of a fused attention node (CostTable.attention)."""
    if attention:
        return "attention"
    return {"matmul": "matmul", "memory": "memory-bound", "comm": "collectives"}.get(node.kind, "other")


def predict(model_spec: str, batch: int, seq: int, device: str) -> dict[str, float]:
    """Predicted seconds by kind, summed over the model's graphs, at batch x seq."""
    from bench.dist_compare import build_model
    model, make, loss_of = build_model(model_spec)
    config = cfg.load({"device": device, "codegen": "inductor", "memory_budget": "none"})
    analyses = []

    def backend(gm, example_inputs):
        with torch.enable_grad():
            analyses.append(analyze_only(config, gm, example_inputs))
        return gm.forward
    args = make(CAPTURE_BATCH, CAPTURE_SEQ)
    kwargs, args = (args, ()) if isinstance(args, dict) else ({}, args)
    with torch.autocast("cpu", torch.bfloat16):
        loss_of(torch.compile(model, backend=backend, dynamic=True)(*args, **kwargs)).backward()
    totals: dict[str, float] = {}
    bmm = any(n.op == "aten.bmm.default" for a in analyses for n in a.costs.nodes)
    if bmm and not any(a.costs.attention.any() for a in analyses):
        totals["caution"] = 1.0   # see main()
    size = {CAPTURE_BATCH: batch, CAPTURE_SEQ: seq}
    for a in analyses:
        ints = {s: h for s, h in a.hints.items() if str(s).startswith("s")}   # sizes (zf*: float scalars)
        unknown = {str(s): h for s, h in ints.items() if h not in size}
        if unknown:     # an integer the graph takes that is neither (a position offset, ...): kept as captured
            print(f"predicted_breakdown: symbols {unknown} are neither the batch ({CAPTURE_BATCH}) nor the "
                  f"sequence ({CAPTURE_SEQ}): kept at their captured values", file=sys.stderr)
        ev = a.evaluate(a.hints | {s: size[h] for s, h in ints.items() if h in size})
        for node, attention, t in zip(a.costs.nodes, a.costs.attention, ev["_node_times"]):
            kind = kind_of(node, attention)
            totals[kind] = totals.get(kind, 0.0) + float(t)
        totals["optimizer"] = totals.get("optimizer", 0.0) + ev["est_optimizer_time_s"]
        totals["step"] = totals.get("step", 0.0) + ev["est_step_time_s"]
    totals["graphs"] = len(analyses)
    return totals


def measured(path: str) -> dict[str, float]:
    """Milliseconds by kind in a committed result's profiled step."""
    r = json.load(open(path))
    p = r.get("profile")
    if not p:
        sys.exit(f"predicted_breakdown: {path} has no `profile` (run bench.dist_compare with --profile)")
    optimizer = sum(k["ms"] for k in p["top_kernels"] if "multi_tensor_apply" in k["name"])
    return {"matmul": p["gemm_ms"], "attention": p["attention_ms"], "optimizer": optimizer,
            "memory-bound": p["compute_busy_ms"] - p["gemm_ms"] - p["attention_ms"] - optimizer,
            "step": r["step_s"] * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="hf/<name>:<size> (examples/hf_zoo.py) or a zoo name (gpt2:774m)")
    ap.add_argument("--batch", type=int, required=True, help="sequences per device")
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--device", default="h200", help="roofline preset (colauto_backend/cost/device.py)")
    ap.add_argument("--against", help="a bench.dist_compare --profile result JSON of the same model and shape")
    args = ap.parse_args()
    got = predict(args.model, args.batch, args.seq, args.device)
    ref = measured(args.against) if args.against else {}
    print(f"{args.model} B{args.batch} x T{args.seq} on the {args.device} preset ({int(got.pop('graphs'))} graph(s))")
    if got.pop("caution", None):
        print("CAUTION: no fused attention kernel in the captured graphs, but batched matmuls: where a GPU runs this "
              "model's attention as a fused kernel (on CPU, SDPA with dropout takes its math path: HF GPT-2 in "
              "training), these predictions are not the GPU's (T5's attention is matmuls on a GPU too)")
    print(f"{'kind':14s} {'predicted ms':>13s}" + (f" {'measured ms':>12s} {'pred/meas':>9s}" if ref else ""))
    for kind in ("matmul", "attention", "memory-bound", "optimizer", "other", "collectives", "step"):
        if kind not in got and kind not in ref:
            continue
        pred = got.get(kind, 0.0) * 1e3
        line = f"{kind:14s} {pred:13.1f}"
        if kind in ref:
            line += f" {ref[kind]:12.1f} {pred / ref[kind]:9.2f}"
        print(line)
    if ref:
        print("(measured step: the timed steps' median, collectives and idle time included)")


if __name__ == "__main__":
    main()
