"""Bandwidth of colauto's generated Triton kernels against eager PyTorch and torch.compile (CUDA).

    python -m bench.kernels --out DIR [--quick]      # --quick: bf16 only
    python -m bench.kernels --out DIR --dry-run      # tiny sizes in Triton's interpreter on CPU

Each kernel is a small function of aten ops, traced with make_fx: colauto compiles the graph into one
kernel (triton_kernels.compile_region), eager runs the same graph op by op, Inductor compiles the
function (torch.compile, default mode). All are memory-bound, so each is scored by achieved bandwidth:
the minimal bytes it must move (every input read once, every output written once) / median time,
against a device copy (torch copy_) as the practical ceiling; times are GPU times of CUDA-graph replays. Each output is checked against eager's,
so a fast but wrong kernel is flagged. Writes DIR/kernels.json and DIR/summary.md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import triton_kernels as tk      # imports Triton lazily: main sets TRITON_INTERPRET first for --dry-run
from triton_kernels import autotune

aten = torch.ops.aten
SIZE = {"gpu": (16384, 4096), "dry": (32, 384)}      # rows x columns: 64M elements; dry: not a block multiple
# bf16 outputs: eager rounds after every op, a fused kernel only at its outputs, so they differ by an ulp or two
TOL = {torch.bfloat16: 3e-2, torch.float32: 1e-4}


def layer_norm(x, w, b):
    return aten.native_layer_norm(x, [x.shape[-1]], w, b, 1e-5)


def rms_norm(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


def layer_norm_backward(g, x, mean, rstd, w):
    return aten.native_layer_norm_backward(g, x, [x.shape[-1]], mean, rstd, w, None, [True, False, False])[0]


def softmax_backward(g, y):
    return aten._softmax_backward_data(g, y, -1, y.dtype)


def layer_norm_bwd_inputs(r, n, d):
    x, w = r(n, d), r(d)
    _, mean, rstd = layer_norm(x, w, None)
    return [r(n, d), x, mean, rstd, w]


# name -> (function of aten ops, its inputs from r(*shape) (randn in the row's dtype) for n rows of d, dtypes)
KERNELS = {
    "bias_gelu_tanh": (lambda x, b: F.gelu(x + b, approximate="tanh"),                         # GPT-2 MLP
                       lambda r, n, d: [r(n, d), r(d)], "bf16 fp32"),
    "residual_add_cast": (lambda x, s: (s + x, (s + x).to(x.dtype)),   # block output into the fp32 stream;
                          lambda r, n, d: [r(n, d), r(n, d).float()], "bf16"),   # the cast is a no-op in fp32
    "silu_mul": (lambda g, u: F.silu(g) * u, lambda r, n, d: [r(n, d), r(n, d)], "bf16 fp32"),  # LLaMA gate
    "softmax": (lambda x: torch.softmax(x, -1), lambda r, n, d: [r(n, d)], "bf16 fp32"),
    "layer_norm": (layer_norm, lambda r, n, d: [r(n, d), r(d), r(d)], "bf16 fp32"),  # out, mean, rstd: all saved
    "rms_norm": (rms_norm, lambda r, n, d: [r(n, d), r(d)], "bf16 fp32"),
    "softmax_bwd": (softmax_backward, lambda r, n, d: [r(n, d), torch.softmax(r(n, d), -1)], "bf16 fp32"),
    "layer_norm_bwd": (layer_norm_backward, layer_norm_bwd_inputs, "bf16 fp32"),               # grad_input only
    "bias_grad": (lambda g: aten.sum.dim_IntList(g, [0]), lambda r, n, d: [r(n, d)], "bf16 fp32"),  # column sum
    "layer_norm_wgrad": (lambda g, x, mean, rstd, w: aten.native_layer_norm_backward(           # column sums
        g, x, [x.shape[-1]], mean, rstd, w, w, [False, True, True])[1:], layer_norm_bwd_inputs, "fp32"),
    "cast_up": (lambda x: x.float(), lambda r, n, d: [r(n, d)], "bf16"),          # autocast's casts: alone
    "cast_down": (lambda x: x.to(torch.bfloat16), lambda r, n, d: [r(n, d).float()], "bf16"),  # between matmuls
    "gelu_bwd": (lambda g, x: aten.gelu_backward(g, x, approximate="tanh"),
                 lambda r, n, d: [r(n, d), r(n, d)], "bf16 fp32"),
}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def as_tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def median_ms(fn, cuda: bool) -> float:
    if cuda:
        # GPU time: fn's kernels replayed as a CUDA graph. Timed launch by launch (CUDA events), a small
        # kernel measured the CPU's launch cost instead (GPT-2's column sums at 16384 x 768). The L2
        # cache is not flushed between replays; copy_ is timed the same way.
        from triton.testing import do_bench_cudagraph
        torch.cuda.synchronize()
        return do_bench_cudagraph(fn, return_mode="median")
    fn()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def max_error(got, want) -> tuple[float, bool]:
    """Max abs error over all outputs, and whether every output is within tolerance of eager's."""
    err, ok = 0.0, True
    for g, w in zip(as_tuple(got), want, strict=True):
        g, w, tol = g.float(), w.float(), TOL[w.dtype]
        err = max(err, (g - w).abs().max().item())
        ok = ok and g.shape == w.shape and torch.allclose(g, w, atol=tol, rtol=tol)
    return err, ok


def measure(label: str, setup, want, nbytes: int, cuda: bool) -> dict:
    """One column: compile (timed), check against eager, time. Any failure becomes the cell's error."""
    try:
        start = time.perf_counter()
        fn = setup()
        got = fn()
        compile_s = time.perf_counter() - start
        err, ok = max_error(got, want) if want is not None else (0.0, True)
        ms = median_ms(fn, cuda)
        return dict(ms=ms, gbps=nbytes / ms / 1e6, max_abs_err=err, ok=ok, compile_s=round(compile_s, 2))
    except Exception as exc:  # noqa: BLE001 - a failed column is a result, not a crash
        return dict(error=f"{label}: {type(exc).__name__}: {' '.join(str(exc).split())}"[:300])


def run_case(name: str, dtype: str, size, device: str, copy_gbps: float) -> dict:
    fn, make_inputs, _ = KERNELS[name]
    torch.manual_seed(0)
    args = make_inputs(lambda *shape: torch.randn(shape, device=device, dtype=DTYPES[dtype]), *size)
    gm = make_fx(fn)(*args)
    want = as_tuple(gm(*args))
    nbytes = sum(t.numel() * t.element_size() for t in [*args, *want])
    cuda = device == "cuda"

    def colauto():
        region = tk.compile_region(gm.graph, args)
        row["launch"] = autotune.shape(region.launch_for(args))     # the block/warp shape autotune kept
        return lambda: region(*args)

    def compiled():
        c = torch.compile(fn)
        return lambda: c(*args)

    row = dict(kernel=name, dtype=dtype, shape=list(size), bytes=nbytes)
    row["colauto"] = measure("colauto", colauto, want, nbytes, cuda)
    row["eager"] = measure("eager", lambda: lambda: gm(*args), None, nbytes, cuda)
    row["inductor"] = measure("inductor", compiled, want, nbytes, cuda)
    if "gbps" in row["colauto"]:
        row["colauto"]["pct_of_copy"] = round(100 * row["colauto"]["gbps"] / copy_gbps, 1)
    return row


def copy_bandwidth(size, device: str) -> float:
    """GB/s of dst.copy_(src) over an fp32 buffer of the kernels' size (read + written)."""
    src = torch.randn(size, device=device)
    dst = torch.empty_like(src)
    return 2 * src.nbytes / median_ms(lambda: dst.copy_(src), device == "cuda") / 1e6


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"      # dry runs' tiny sizes still show digits


def _gbps(cell: dict) -> str:
    return "FAILED" if "error" in cell else _num(cell["gbps"])


def _check(cell: dict) -> str:
    return "" if "error" in cell else f"{cell['max_abs_err']:.2g}" + ("" if cell["ok"] else " WRONG")


def markdown(result: dict) -> str:
    head = ["kernel", "dtype", "MiB moved", "colauto GB/s", "% of copy", "eager GB/s", "inductor GB/s",
            "colauto err", "inductor err", "launch"]
    lines = [f"{result['device']}, torch {result['torch']}, triton {result['triton']}, {result['date']}; "
             f"copy_ {_num(result['copy_gbps'])} GB/s; shape {result['shape'][0]} x {result['shape'][1]}; "
             f"times: {result['timing']}. "
             "err: max abs error vs eager (WRONG: outside tolerance).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result["rows"]:
        c = r["colauto"]
        lines.append("| " + " | ".join([
            r["kernel"], r["dtype"], _num(r["bytes"] / 2**20), _gbps(c), str(c.get("pct_of_copy", "")),
            _gbps(r["eager"]), _gbps(r["inductor"]), _check(c), _check(r["inductor"]), r.get("launch", "")]) + " |")
    errors = [f"- {r['kernel']} {r['dtype']} {cell['error']}" for r in result["rows"]
              for cell in (r["colauto"], r["eager"], r["inductor"]) if "error" in cell]
    return "\n".join(lines + ([""] + errors if errors else [])) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kernels", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--quick", action="store_true", help="bf16 only")
    ap.add_argument("--shape", help="ROWSxCOLS on the GPU (default 16384x4096; GPT-2 124M's rows: 16384x768)")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny sizes on CPU in Triton's interpreter: checks the script, not the speed")
    args = ap.parse_args(argv)
    if args.dry_run:
        # Triton reads it when a kernel is decorated, and its own helpers are decorated at import
        os.environ["TRITON_INTERPRET"] = "1"
        device, size = "cpu", SIZE["dry"]
    elif torch.cuda.is_available():
        device, size = "cuda", tuple(int(n) for n in args.shape.split("x")) if args.shape else SIZE["gpu"]
    else:
        sys.exit("bench.kernels needs a CUDA GPU and found none (--dry-run checks the script on CPU)")
    import triton

    copy_gbps = copy_bandwidth(size, device)
    result = dict(device=torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)",
                  torch=torch.__version__, triton=triton.__version__,
                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  command="python -m bench.kernels " + " ".join(sys.argv[1:] if argv is None else argv),
                  timing="median GPU time of CUDA-graph replays (L2 not flushed)" if device == "cuda" else "wall",
                  shape=list(size), copy_gbps=copy_gbps, rows=[])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, (_, _, dtypes) in KERNELS.items():
        for dtype in dtypes.split():
            if args.quick and dtype != "bf16":
                continue
            print(f"{name} {dtype} ...", end=" ", flush=True)
            start = time.perf_counter()
            row = run_case(name, dtype, size, device, copy_gbps=copy_gbps)
            result["rows"].append(row)
            print(f"{_gbps(row['colauto'])} GB/s ({time.perf_counter() - start:.1f} s)", flush=True)
            if device == "cuda":
                torch.cuda.empty_cache()
    summary = markdown(result)
    (out / "kernels.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "summary.md").write_text(summary)
    print("\n" + summary + f"wrote {out}/kernels.json, {out}/summary.md")
    cells = [c for r in result["rows"] for c in (r["colauto"], r["eager"], r["inductor"])]
    return 1 if any("error" in c or not c.get("ok", True) for c in cells) else 0


if __name__ == "__main__":
    sys.exit(main())
