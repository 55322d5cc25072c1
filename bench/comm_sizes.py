"""Collective times on this machine's GPUs, alone and beside matmuls: what the planner's alpha-beta link
model (colauto_backend/parallel/comm.py) should say for each collective a plan issues.

    torchrun --nproc-per-node 4 -m bench.comm_sizes --out comm_sizes.json

For the whole world and for pairs of neighbouring ranks (the group a tp=2 axis, innermost, runs on), and
for all-gather, reduce-scatter and all-reduce in fp32 and bf16, each size from 1 to 256 MiB is timed with
CUDA events around the collective (the stream waits for NCCL's, as a compiled graph's wait does), each
rank's mean over the repeats, the slowest rank's taken: first alone, then while another stream runs
bf16 matmuls (the compute a collective runs beside). The matmuls' own rate, alone and beside the
collectives, is measured too. Writes every point with its bus bandwidth (NCCL-tests' convention:
(p-1)/p·n/t for all-gather and reduce-scatter, twice that for all-reduce, n the whole tensor's bytes)
and the alpha-beta fit per (group size, op, dtype, alone/beside), as `colauto_backend.calibrate.fit`
fits all-reduce.

Written 2026-11-28 to measure why tensor-parallel activation collectives ran ~4x slower than the link
model on 4 H200s (bench/results/h200x4-2026-11-28-hf-8b-t2048-trace/); first run on 2 H200s
(bench/results/h200x2-2026-11-28-fsdp-peak-comm/, where "pairs" is not formed: the world is the pair).
"""
from __future__ import annotations

import argparse
import json
import os

for _var, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                     ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_var, _value)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

SIZES_MIB = (1, 4, 16, 64, 256)
OPS = ("all_gather", "reduce_scatter", "all_reduce")


def run_op(op: str, n_bytes: int, dtype: torch.dtype, group, p: int):
    """A callable issuing one collective of `n_bytes` (the whole tensor) over `group`."""
    numel = n_bytes // torch.tensor([], dtype=dtype).element_size()
    whole = torch.ones(numel, dtype=dtype, device="cuda")
    part = torch.ones(numel // p, dtype=dtype, device="cuda")
    if op == "all_gather":
        return lambda: dist.all_gather_into_tensor(whole, part, group=group)
    if op == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(part, whole, group=group)
    return lambda: dist.all_reduce(whole, group=group)


def timed(fn, repeats: int, warm_up: bool = True) -> float:
    """Seconds a call, this rank's mean; the slowest rank's is the collective's time. Without `warm_up`
    nothing waits for the device first (matmuls queued beside keep running)."""
    if warm_up:
        fn()
        torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    t = torch.tensor([start.elapsed_time(end) / 1e3 / repeats], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


class Matmuls:
    """bf16 matmuls queued on their own stream, enough to outlast what is timed beside them."""

    def __init__(self, side: int = 8192):
        self.a = torch.randn(side, side, device="cuda", dtype=torch.bfloat16)
        self.stream = torch.cuda.Stream()
        self.flops = 2 * side ** 3

    def queue(self, count: int) -> None:
        with torch.cuda.stream(self.stream):
            for _ in range(count):
                torch.mm(self.a, self.a)

    def rate(self, count: int = 50) -> float:
        """FLOP/s of `count` matmuls on their stream."""
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(self.stream)
        self.queue(count)
        end.record(self.stream)
        torch.cuda.synchronize()
        return count * self.flops / (start.elapsed_time(end) / 1e3)


def bus_bandwidth(op: str, n_bytes: int, p: int, t: float) -> float:
    factor = 2 if op == "all_reduce" else 1
    return factor * (p - 1) / p * n_bytes / t


def fit(points: list[tuple[int, float]], op: str, p: int) -> tuple[float, float]:
    """alpha, beta from t = k(p-1)·alpha + k(p-1)/p·n/beta (k = 2 for all-reduce, else 1)."""
    k = 2 if op == "all_reduce" else 1
    a = np.array([[k * (p - 1), k * (p - 1) / p * n] for n, _ in points])
    (alpha, inv_beta), *_ = np.linalg.lstsq(a, np.array([t for _, t in points]), rcond=None)
    return max(float(alpha), 0.0), 1.0 / max(float(inv_beta), 1e-15)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("comm_sizes needs CUDA GPUs (it times NCCL collectives)")
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    world = dist.get_world_size()
    pair, _ = dist.new_subgroups(2)
    groups = [("world", None, world)] + ([("pairs", pair, 2)] if world > 2 else [])
    mm = Matmuls()
    mm.rate(5)
    result = {"world": world, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "nccl": ".".join(map(str, torch.cuda.nccl.version())), "matmul_flops_alone": mm.rate(), "points": []}
    beside_rates = []
    for gname, group, p in groups:
        for op in OPS:
            for dtype in (torch.float32, torch.bfloat16):
                for mib in SIZES_MIB:
                    n = mib * 2 ** 20
                    fn = run_op(op, n, dtype, group, p)
                    alone = timed(fn, args.repeats)
                    # beside: matmuls queued first on their stream, so they run through the timed calls
                    torch.cuda.synchronize()
                    dist.barrier()
                    mm.queue(max(4, int(alone * args.repeats * 3 * 1.0e15 / mm.flops)))
                    beside = timed(fn, args.repeats, warm_up=False)
                    result["points"].append(dict(group=gname, p=p, op=op, dtype=str(dtype).split(".")[-1], bytes=n,
                                                 alone_s=alone, beside_s=beside,
                                                 busbw_alone=bus_bandwidth(op, n, p, alone),
                                                 busbw_beside=bus_bandwidth(op, n, p, beside)))
                    torch.cuda.synchronize()
        # the matmuls' rate while this group's largest all-reduce runs beside them
        fn = run_op("all_reduce", SIZES_MIB[-1] * 2 ** 20, torch.float32, group, p)
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(mm.stream)
        mm.queue(50)
        end.record(mm.stream)
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        beside_rates.append((gname, 50 * mm.flops / (start.elapsed_time(end) / 1e3)))
    result["matmul_flops_beside_all_reduce"] = dict(beside_rates)
    fits = {}
    for key in {(q["group"], q["p"], q["op"], q["dtype"]) for q in result["points"]}:
        pts = [q for q in result["points"] if (q["group"], q["p"], q["op"], q["dtype"]) == key]
        for mode in ("alone", "beside"):
            alpha, beta = fit([(q["bytes"], q[f"{mode}_s"]) for q in pts], key[2], key[1])
            fits["/".join(map(str, key)) + "/" + mode] = {"alpha_s": alpha, "bandwidth": beta}
    result["fits"] = fits
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"matmul {result['matmul_flops_alone'] / 1e12:.0f} TFLOP/s alone; beside all-reduces: "
              + ", ".join(f"{g} {r / 1e12:.0f}" for g, r in beside_rates))
        for k in sorted(fits):
            print(f"{k:<40} alpha {fits[k]['alpha_s'] * 1e6:7.1f} us  bus bandwidth {fits[k]['bandwidth'] / 1e9:6.1f} GB/s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
