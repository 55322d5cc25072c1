"""Measure the interconnect's alpha (latency) and beta (bus bandwidth) for the planner.

    torchrun --nproc-per-node 4 -m colauto_backend.calibrate --out comm.json
    COLAUTO_COMM=comm.json torchrun ... your_script.py

Times all-reduce over sizes from 64 KiB to 256 MiB on every rank, fits t = 2(p-1)·alpha +
2(p-1)/p · n / beta by least squares, and writes {"name", "alpha_s", "bandwidth", "world", "points"}.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import torch.distributed as dist

from .parallel import mesh


def measure(sizes: list[int], repeats: int) -> list[tuple[int, float]]:
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    out = []
    for n in sizes:
        x = torch.ones(n // 4, dtype=torch.float32, device=device)
        dist.all_reduce(x)                          # warm-up (and NCCL communicator set-up)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            dist.all_reduce(x)
        if cuda:
            torch.cuda.synchronize()
        t = torch.tensor([(time.perf_counter() - start) / repeats], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)   # the slowest rank is the collective's time
        out.append((n, float(t)))
    return out


def fit(points: list[tuple[int, float]], p: int) -> tuple[float, float]:
    """alpha, beta from t = 2(p-1)·alpha + 2(p-1)/p · n / beta (least squares, both kept positive)."""
    a = np.array([[2 * (p - 1), 2 * (p - 1) / p * n] for n, _ in points])
    t = np.array([t for _, t in points])
    (alpha, inv_beta), *_ = np.linalg.lstsq(a, t, rcond=None)
    return max(float(alpha), 0.0), 1.0 / max(float(inv_beta), 1e-15)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="comm.json")
    ap.add_argument("--max-mib", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    if mesh.world_size() < 2:
        raise SystemExit("calibrate: run it under torchrun with at least 2 processes")
    mesh.ensure_process_group()
    sizes = [2 ** k for k in range(16, 21 + args.max_mib.bit_length()) if 2 ** k <= args.max_mib * 2 ** 20]
    points = measure(sizes, args.repeats)
    p = dist.get_world_size()
    alpha, beta = fit(points, p)
    if dist.get_rank() == 0:
        result = {"name": f"calibrated-{p}x{'cuda' if torch.cuda.is_available() else 'cpu'}",
                  "alpha_s": alpha, "bandwidth": beta, "world": p, "points": points}
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"alpha {alpha * 1e6:.1f} us, bus bandwidth {beta / 1e9:.1f} GB/s over {p} ranks -> {args.out}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
