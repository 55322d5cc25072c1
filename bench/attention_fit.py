"""The fused-attention rate of the H100/H200 presets (colauto_backend/cost/device.py), refitted from the
committed GPU profiles: each `bench.dist_compare --profile` JSON under bench/results/ whose model is one
of SHAPES gives its attention kernels' time for one step; their FLOPs by the formula (forward 4*b*h*s_q*s_k*d,
backward twice that, per layer) over that time is the measured rate. rate = R * s_k / (s_k + c) is fitted
by least squares in log space (a grid: R in whole TFLOP/s, c in whole keys) over the runs without dropout;
the dropout factor is the geometric mean of the dropout runs' time over the model's.

    python -m bench.attention_fit          # prints each run, the fit and each run's error
"""
from __future__ import annotations

import glob
import json
import math
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
# model (and seq) -> (query rows x heads per layer call on one rank, s_k, head dim, layers, dropout)
SHAPES = {
    ("hf/llama:8b", 8192): (1 * 32 * 8192, 8192, 128, 32, False),
    # dp=2,tp=2 and FSDP2 alike: each rank's attention is 1 x 32 heads or the tp pair's 2 x 16
    ("hf/llama:8b", 2048): (65536, 2048, 128, 32, False),
    ("hf/llama:bench", 1024): (4 * 32 * 1024, 1024, 64, 22, False),
    ("hf/qwen2:bench", 1024): (8 * 14 * 1024, 1024, 64, 24, False),
    ("hf/gpt2:bench", 1024): (8 * 20 * 1024, 1024, 64, 36, True),
}


def runs() -> list[dict]:
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "**", "*.json"), recursive=True)):
        d = json.load(open(path))
        if not isinstance(d, dict):  # e.g. parallel_matrix.py's matrix.json, a list of cells
            continue
        prof, key = d.get("profile"), (d.get("model"), d.get("seq"))
        if not isinstance(prof, dict) or "attention_ms" not in prof or key not in SHAPES:
            continue
        rows, s_k, dim, layers, dropout = SHAPES[key]
        flops = 3 * 4 * rows * s_k * dim * layers
        out.append(dict(path=os.path.relpath(path, ROOT), config=d["config"], s_k=s_k, dropout=dropout,
                        ms=prof["attention_ms"], rate=flops / (prof["attention_ms"] * 1e-3)))
    return out


def model_rate(p: dict, rate: float, overhead: float) -> float:
    """The model's FLOP/s for run `p` without dropout: rate * s_k / (s_k + overhead)."""
    return rate * p["s_k"] / (p["s_k"] + overhead)


def fit(points: list[dict]) -> tuple[float, float]:
    plain = [p for p in points if not p["dropout"]]
    best = min(((sum(math.log(model_rate(p, r * 1e12, c) / p["rate"]) ** 2 for p in plain), r, c)
                for r in range(100, 400) for c in range(0, 2000, 5)))
    return best[1] * 1e12, float(best[2])


def dropout_factor(points: list[dict], rate: float, overhead: float) -> float:
    """The geometric mean, over the runs with dropout, of their time over the model's without it."""
    drops = [model_rate(p, rate, overhead) / p["rate"] for p in points if p["dropout"]]
    return math.exp(sum(map(math.log, drops)) / len(drops)) if drops else 1.0


def main() -> None:
    points = runs()
    rate, overhead = fit(points)
    factor = dropout_factor(points, rate, overhead)
    print(f"fit over {sum(not p['dropout'] for p in points)} runs: R = {rate / 1e12:.0f} TFLOP/s, c = {overhead:.0f} keys; "
          f"dropout factor {factor:.2f} ({sum(p['dropout'] for p in points)} runs)")
    for p in points:
        model = model_rate(p, rate, overhead) / (factor if p["dropout"] else 1.0)
        print(f"  {p['path'][:78]:78s} {p['config']:15s} {p['ms']:8.2f} ms {p['rate'] / 1e12:6.1f} TFLOP/s, "
              f"model {model / 1e12:6.1f}: model's time {p['rate'] / model - 1:+6.1%}")


if __name__ == "__main__":
    main()
