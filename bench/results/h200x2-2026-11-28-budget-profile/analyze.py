"""GPU time per step by kernel category, unbudgeted against budgeted colauto (CPU, stdlib only):
    python3 bench/results/h200x2-2026-11-28-budget-profile/analyze.py
Reads nobudget/<model>/*.kernels.csv and budget/<model>/*.kernels.csv (two profiled steps each)."""
import csv
import glob
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))


def category(name: str) -> str:
    if re.search(r"nvjet|gemm|cutlass|xmma|cublas", name):
        return "matmul (cuBLAS)"
    if re.search(r"cudnn|flash|fmha|sdpa", name) and not name.startswith("triton"):
        return "attention (cuDNN)"
    if "adam" in name.lower() or "multi_tensor" in name:
        return "optimizer"
    if name.startswith("triton"):
        if "log_softmax" in name or "nll" in name:
            return "Inductor: the loss"
        if "embedding" in name:
            return "Inductor: kernels holding the embedding"
        if re.search(r"_cos_|_sin_|_bmm_", name):
            return "Inductor: kernels holding the rotary table (cos/sin/bmm)"
        return "Inductor: other fused kernels"
    return "other"


def load(side: str, model: str) -> dict:
    (path,) = glob.glob(os.path.join(HERE, side, model, "*.kernels.csv"))
    out = {}
    for row in csv.DictReader(open(path)):
        ms, calls = out.get(category(row["name"]), (0.0, 0))
        out[category(row["name"])] = (ms + float(row["device_us_total"]) / 2e3, calls + int(row["calls"]) // 2)
    return out


for model in ("hf_qwen3", "hf_qwen2"):
    a, b = load("nobudget", model), load("budget", model)
    print(f"\n## {model}: GPU ms per step (kernels per step), no budget -> budget\n")
    print("| category | no budget | budget | difference |\n|---|---|---|---|")
    for cat in sorted(set(a) | set(b), key=lambda c: -abs(b.get(c, (0, 0))[0] - a.get(c, (0, 0))[0])):
        (ta, na), (tb, nb) = a.get(cat, (0.0, 0)), b.get(cat, (0.0, 0))
        print(f"| {cat} | {ta:.2f} ({na}) | {tb:.2f} ({nb}) | {tb - ta:+.2f} |")
    print(f"| **all kernels** | {sum(t for t, _ in a.values()):.2f} | {sum(t for t, _ in b.values()):.2f} | "
          f"{sum(t for t, _ in b.values()) - sum(t for t, _ in a.values()):+.2f} |")
