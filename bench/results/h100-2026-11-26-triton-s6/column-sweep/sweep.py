"""One-off sweep (run from the repo root on a GPU): column-sum kernels under many launch shapes, timed by
GPU time (CUDA-graph replay), against Inductor and eager. Chose tuning.COLUMN_CANDIDATES."""
import itertools
import sys

import torch
import triton.testing as tt
from torch.fx.experimental.proxy_tensor import make_fx

sys.path.insert(0, ".")
import triton_kernels as tk  # noqa: E402
from bench.kernels import DTYPES, KERNELS  # noqa: E402
from triton_kernels.tuning import Tuning  # noqa: E402


def bench(fn):
    return tt.do_bench_cudagraph(fn, rep=20, return_mode="median")


for name, dtype, d in (("bias_grad", "bf16", 768), ("bias_grad", "bf16", 3072), ("layer_norm_wgrad", "fp32", 768)):
    fn, make_inputs, _ = KERNELS[name]
    torch.manual_seed(0)
    args = make_inputs(lambda *s: torch.randn(s, device="cuda", dtype=DTYPES[dtype]), 16384, d)
    gm = make_fx(fn)(*args)
    out = gm(*args)
    want = [w.float() for w in (out if isinstance(out, (tuple, list)) else [out])]
    nbytes = sum(t.numel() * t.element_size() for t in args)
    c = torch.compile(fn)
    c(*args)
    print(f"{name} {dtype} {d}: inductor {bench(lambda: c(*args)) * 1e3:.1f} us, "
          f"eager {bench(lambda: gm(*args)) * 1e3:.1f} us, read {nbytes / 2 ** 20:.0f} MiB")
    res = []
    for cb, cr, cp, w in itertools.product((32, 64, 128, 256), (8, 16, 32, 64, 128), (256, 512, 1024, 2048), (4, 8)):
        region = tk.compile_region(gm.graph, args, tuning=Tuning(column_block=cb, column_rows=cr,
                                                                  column_programs=cp, column_warps=w))
        ok = all(torch.allclose(g.float(), x, atol=0.05, rtol=0.02) for g, x in zip(region(*args), want))
        splits = region.launch_for(args).allocs[0][0][0]
        res.append((bench(lambda: region(*args)), cb, cr, cp, w, splits, ok))
    res.sort()
    for t, cb, cr, cp, w, splits, ok in res[:12]:
        print(f"  {t * 1e3:7.1f} us  block={cb} rows={cr} programs={cp} warps={w} splits={splits} ok={ok}")
    part = torch.randn(res[0][5], d, device="cuda")
    print(f"  finish alone (sum of {res[0][5]} partial rows): {bench(lambda: part.sum(0)) * 1e3:.1f} us")
    print("  default:", [f"{r[0] * 1e3:.1f}" for r in res if r[1:5] == (64, 32, 1024, 4)])
