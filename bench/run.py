"""Benchmark harness: a model x mode matrix of training steps -> JSON, a Markdown table and a PNG plot.

    python -m bench.run                                   # default matrix for the device found
    python -m bench.run --models gpt2:124m:16:1024 --modes eager,colauto --out /tmp/b
    python -m bench.run --suite hf                        # HuggingFace causal LMs as users have them

Models are the project's zoo (examples/models.py: `gpt2:124m:16:1024`) or transformers classes built
from configs with random weights (examples/hf_zoo.py: `hf/qwen2:bench:8:1024`, called as
`model(input_ids=x, labels=x).loss`, exactly as a user's script does).

Each row is one (model, mode) built fresh; colauto rows also carry colauto's prediction of the peak
memory and step time, and the relative error of each against the measurement.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import re
import shlex
import socket
import sys
import time
from pathlib import Path

import torch

import colauto_backend
from colauto_backend import backend as colauto_backend_mod
from colauto_backend import config as colauto_config
from colauto_backend import counters
from examples import hf_zoo
from examples.models import build

# Multi-GPU runs on these hosts must not use NVLink multicast (NVLS); NCCL and NVSHMEM read these
# when a process group is created, so setting them at import is early enough.
for _var, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                     ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_var, _value)

# Without `pip install -e .` the torch_dynamo_backends entry point is missing (as on a bare GPU host);
# register the same function by hand so backend="colauto" still resolves.
if "colauto" not in torch._dynamo.list_backends(exclude_tags=()):
    torch._dynamo.register_backend(colauto_backend.colauto, name="colauto")

DEFAULT_MODELS = {"cpu": "gpt2:tiny:4:64,llama:tiny:4:64",
                  "cuda": "gpt2:124m:16:1024,gpt2:355m:8:1024,llama:1b:4:1024"}
# mode -> torch.compile options for colauto (None = whatever COLAUTO_CODEGEN says)
COLAUTO_MODES = {"colauto": None, "colauto-aten": {"codegen": "aten"}, "colauto-triton": {"codegen": "triton"},
                 "colauto-inductor": {"codegen": "inductor"},
                 "colauto-cg": {"cudagraphs": True},                                # + CUDA graphs
                 "colauto-triton-cg": {"codegen": "triton", "cudagraphs": True}}
MODES = ("eager", "inductor", "inductor-cg", *COLAUTO_MODES)       # inductor-cg: mode="reduce-overhead"
GiB = 2 ** 30
# --suite hf: every causal LM of examples/hf_zoo.py at its public checkpoint's shape, T=1024
SUITES = {"hf": ",".join(f"hf/{n}:bench:{hf_zoo.SPECS[n].bench_batch}:1024" for n in hf_zoo.CAUSAL_BENCH)}
SUITE_MODES = {"hf": "eager,inductor,inductor-cg,colauto,colauto-cg,colauto-aten,colauto-inductor,colauto-triton,"
                     "colauto-triton-cg"}


def parse_models(text: str) -> list[dict]:
    specs = []
    for item in filter(None, text.split(",")):
        parts = item.split(":")
        if len(parts) != 4:
            raise ValueError(f"model {item!r}: expected name:size:batch:seq")
        specs.append(dict(model=parts[0], size=parts[1], batch=int(parts[2]), seq=int(parts[3])))
    return specs


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    p.add_argument("--models", help="comma list of name:size:batch:seq (seq = image side for image models); "
                                    "hf/<name>:bench|tiny:batch:seq for a transformers model of examples/hf_zoo.py")
    p.add_argument("--suite", choices=tuple(SUITES), help="a named model list: hf = the causal LMs of "
                   f"examples/hf_zoo.py ({', '.join(hf_zoo.CAUSAL_BENCH)}); --models adds to it")
    p.add_argument("--modes", help=f"comma list of {', '.join(MODES)} (default: eager,inductor,colauto; "
                                   "with --suite hf every mode)")
    p.add_argument("--steps", type=int, default=12, help="timed steps")
    p.add_argument("--hold-outputs", action="store_true",
                   help="transformers models: hold the model's output (its logits) until after the optimizer step, "
                        "as colauto's memory model assumes (default: only the loss is kept, as `loss = model(**batch).loss`)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (the first one compiles)")
    p.add_argument("--dtype", choices=("bf16", "fp32"), help="autocast dtype (default bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda if available")
    p.add_argument("--out", help="output directory (default bench/results/<device>-<date>)")
    p.add_argument("--tag", help="name of the default output directory")
    p.add_argument("--profile", action="store_true",
                   help="after the timed steps, profile two more (CUDA): the top kernels by GPU time go to "
                        "profile-<model>-<size>-<mode>.txt beside the results")
    args = p.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    if args.suite:
        args.models = ",".join(filter(None, (SUITES[args.suite], args.models)))
    args.modes = args.modes or SUITE_MODES.get(args.suite, "eager,inductor,colauto")
    try:
        args.models = parse_models(args.models or DEFAULT_MODELS[args.device])
    except ValueError as exc:  # also a batch or seq that is not an integer
        p.error(str(exc))
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if bad := [m for m in args.modes if m not in MODES]:
        p.error(f"unknown mode(s) {bad}; use {', '.join(MODES)}")
    if args.steps < 1 or args.warmup < 1:
        p.error("--steps and --warmup must be >= 1 (the first warm-up step is the compile time)")
    return args


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def default_out(args: argparse.Namespace) -> Path:
    # e.g. "h100-80gb-hbm3-2026-05-10": a readable, path-safe device name plus the UTC date
    slug = re.sub(r"[^a-z0-9]+", "-", device_name(args.device).lower()).strip("-").removeprefix("nvidia-")
    tag = args.tag or f"{slug}-{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}"
    return Path(__file__).parent / "results" / tag


def autocast(args: argparse.Namespace):
    # fp32 runs get no autocast at all, so they measure the plain fp32 model
    if args.dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(args.device, torch.bfloat16)


def compiled(model: torch.nn.Module, mode: str):
    if mode == "eager":
        return model
    if mode == "inductor":
        return torch.compile(model)
    if mode == "inductor-cg":
        return torch.compile(model, mode="reduce-overhead")
    options = COLAUTO_MODES[mode]
    return torch.compile(model, backend="colauto", **({"options": options} if options else {}))


def make_optimizer(model: torch.nn.Module, device: str) -> torch.optim.Optimizer:
    # fused AdamW on CUDA is what the memory model calls "adamw"; CPU keeps the plain per-tensor loop
    kw = dict(fused=True) if device == "cuda" else dict(fused=False, foreach=False)
    return torch.optim.AdamW(model.parameters(), lr=1e-4, **kw)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def build_model(spec: dict, device: str):
    """(model, make_inputs, loss_of): the zoo's models take `(x, targets)` and return the loss; a
    transformers model takes keyword arguments and returns a ModelOutput whose `.loss` is the loss."""
    if spec["model"].startswith("hf/"):
        model, batch = hf_zoo.build_hf(spec["model"][3:], spec["size"], device=device)
        return model, lambda b, t: (batch(b, t),), lambda fn, inputs: fn(**inputs[0])
    model, make_inputs = build(spec["model"], spec["size"], device=device)
    return model, make_inputs, lambda fn, inputs: fn(*inputs)


def predict(model, make_inputs, spec: dict, args, options: dict | None) -> dict:
    """colauto's prediction for this model, made before any training allocates memory."""
    # fresh inputs: profile() marks its inputs' dims dynamic, which must not leak into training
    inputs = make_inputs(spec["batch"], spec["seq"])
    t0 = time.perf_counter()
    with autocast(args):
        # the mode's own options (codegen): the prediction must describe the plan that will run
        prof = colauto_backend.profile(model, *inputs, options={"optimizer": "adamw", **(options or {})})
    pred = dict(pred_peak_bytes=prof.peak_memory_bytes, pred_step_time_s=prof.est_step_time_s,
                pred_saved_activation_bytes=prof.saved_activation_bytes, peak_at=prof.details["peak_at"],
                profile_s=time.perf_counter() - t0)
    del prof, inputs
    torch._dynamo.reset()                # drop the capture's cache entry before the real compile
    colauto_backend_mod.ANALYSES.clear()  # the backend keeps every analysis; don't grow across rows
    return pred


def predicted_by_compiled_graphs(hold_outputs: bool = False) -> dict:
    """The prediction of the graph the training step ran (HF models, whose keyword inputs `predict` does not
    pass): its planned peak and step time, as the plan chose them. A step of several training graphs (graph
    breaks) is not predicted: each graph is planned alone, and their peaks do not add up to the step's."""
    trained = [a for a in colauto_backend_mod.ANALYSES if a.planner is not None]
    if len(trained) != 1:
        return dict(pred_note=f"not predicted: the step ran {len(trained)} training graphs")
    ev = trained[0].evaluate(trained[0].hints)
    # the peak with the graphs run as Inductor's generated code allocates (codegen inductor; None: not read),
    # for this script: the model's output dropped after the forward unless --hold-outputs
    compiled = trained[0].compiled_peak(outputs_dropped=not hold_outputs)
    return dict(pred_peak_bytes=ev["peak_memory_bytes"], pred_step_time_s=ev["est_step_time_s"],
                pred_saved_activation_bytes=ev["saved_activation_bytes"], peak_at=ev["peak_at"],
                pred_source="the compiled training graph",
                compiled_peak_bytes=compiled[0] if compiled else None, compiled_peak_at=compiled[1] if compiled else None)


def training_step(fn, opt, x, targets, args, loss_of=None):
    """One step as the user's script would run it: autocast forward, backward, optimizer, grads to None.
    `loss_of(fn, inputs)` calls a model that does not take `(x, targets)` (a transformers model) and gives
    its output, whose loss trains; the output (its logits) is dropped before the backward, unless
    `args.hold_outputs`: then it is held until after the optimizer step, as the memory model assumes."""
    held = None
    with autocast(args):
        if loss_of is None:
            loss = fn(x, targets)
        else:
            held = loss_of(fn, (x,) if targets is None else (x, targets))   # the zoo's models: the loss itself
            loss = held if isinstance(held, torch.Tensor) else hf_zoo.loss_of(held)
    if not getattr(args, "hold_outputs", False):
        held = None
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    del held
    return loss


def train(model, make_inputs, spec: dict, mode: str, args, compile_fn=None, loss_of=None) -> dict:
    """Warm-up (the first step is timed alone: compile time), then the timed steps. `compile_fn`
    replaces the mode's own torch.compile call (the remat sweep passes its own options)."""
    x, *rest = make_inputs(spec["batch"], spec["seq"])
    targets = rest[0] if rest else None
    opt = make_optimizer(model, args.device)
    sync(args.device)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    # the first step's time counts from the torch.compile call: with Inductor as the backend, that call
    # already imports Inductor (about 1,500 modules); a named backend such as colauto does so in the step
    t0 = time.perf_counter()
    fn = compile_fn(model) if compile_fn is not None else compiled(model, mode)

    def step():
        return training_step(fn, opt, x, targets, args, loss_of)

    step()
    sync(args.device)
    warmup_s = time.perf_counter() - t0
    for _ in range(args.warmup - 1):
        step()
    sync(args.device)
    if args.device == "cuda":
        # a CUDA graph's memory is allocated from its private pool when it is recorded (warm-up), and
        # replays allocate nothing: the peak over timed steps alone would leave the graph's workspace out
        run_peak = torch.cuda.max_memory_allocated()
        # peak over the timed steps only: optimizer state already exists, compile workspaces are gone
        torch.cuda.reset_peak_memory_stats()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.steps):
            loss = step()
        end.record()
        end.synchronize()
        step_s = start.elapsed_time(end) / 1e3 / args.steps
        peak = torch.cuda.max_memory_allocated()
        if mode.endswith("-cg"):
            peak = max(peak, run_peak)
    else:
        t0 = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        step_s, peak = (time.perf_counter() - t0) / args.steps, None
    if getattr(args, "profile", False) and args.device == "cuda":
        name = spec["model"].replace("/", "-")      # hf/llama -> hf-llama: one file beside the results
        profile_kernels(step, args.out_dir / f"profile-{name}-{spec['size']}-{mode}.txt")
    tokens = spec["batch"] * spec["seq"]
    return dict(step_time_s=step_s, tokens_per_s=tokens / step_s, peak_bytes=peak, warmup_s=warmup_s,
                loss=loss.item())


def profile_kernels(step, path: Path) -> None:
    """Two steps under torch.profiler: the kernels that took the most GPU time, as a table."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            step()
        sync("cuda")
    path.write_text(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=90) + "\n")


def run_one(spec: dict, mode: str, args) -> dict:
    row = dict(spec, mode=mode, error=None)
    model = None
    try:
        if mode in COLAUTO_MODES:  # the codegen in effect: options= if given, else COLAUTO_CODEGEN
            config = colauto_config.load(COLAUTO_MODES[mode])
            example = [torch.empty(0, device=args.device)]   # codegen auto is resolved by the inputs' device
            row["codegen"] = colauto_config.resolve_codegen(config, example).codegen
        model, make_inputs, loss_of = build_model(spec, args.device)  # fp32 weights
        row["params"] = sum(p.numel() for p in model.parameters())
        if mode in COLAUTO_MODES and not spec["model"].startswith("hf/"):   # profile() takes positional inputs
            row.update(predict(model, make_inputs, spec, args, COLAUTO_MODES[mode]))
        colauto_backend_mod.ANALYSES.clear()
        counted = counters.snapshot()["counts"]
        row.update(train(model, make_inputs, spec, mode, args, loss_of=loss_of))
        if mode in COLAUTO_MODES:   # what the compile did (re-plans, looser plans, ...): the counts it added
            row["counters"] = {name: added for name, c in counters.snapshot()["counts"].items()
                               if (added := {k: v - counted.get(name, {}).get(k, 0) for k, v in c.items()
                                             if v != counted.get(name, {}).get(k, 0)})}
        if mode in COLAUTO_MODES and "pred_peak_bytes" not in row:
            row.update(predicted_by_compiled_graphs(getattr(args, "hold_outputs", False)))
        if row.get("pred_peak_bytes") and row["peak_bytes"]:
            row["peak_error"] = row["pred_peak_bytes"] / row["peak_bytes"] - 1
        if row.get("compiled_peak_bytes") and row["peak_bytes"]:
            row["compiled_peak_error"] = row["compiled_peak_bytes"] / row["peak_bytes"] - 1
        if row.get("pred_step_time_s"):
            row["time_error"] = row["pred_step_time_s"] / row["step_time_s"] - 1
    except Exception as exc:  # noqa: BLE001 - OOM or any failure becomes a FAILED row, never a crash
        row["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:500]  # one line, bounded
    finally:
        del model
        torch._dynamo.reset()
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return row


def environment(args, argv: list[str], prog: str = "bench.run") -> dict:
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return dict(torch=torch.__version__, triton=triton_version, python=sys.version.split()[0],
                device=device_name(args.device),
                gpu_count=torch.cuda.device_count() if torch.cuda.is_available() else 0,
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                hostname=socket.gethostname(), command=f"python -m {prog} " + shlex.join(argv),
                colauto_codegen_env=os.environ.get("COLAUTO_CODEGEN"),
                dtype=args.dtype, steps=args.steps, warmup=args.warmup)


def _gib(b) -> str:
    return "n/a" if b is None else f"{b / GiB:.2f}" if b >= GiB else f"{b / GiB:.3g}"


def _err(e) -> str:
    return "" if e is None else f" ({e * 100:+.0f}%)"


def markdown(rows: list[dict]) -> str:
    head = ["model", "B", "T", "mode", "tokens/s", "step ms", "peak GiB", "predicted peak GiB (error %)",
            "predicted step ms (error %)", "warm-up s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [f"{r['model']} {r['size']}", str(r["batch"]), str(r["seq"]), r["mode"]]
        if r["error"]:
            reason = r["error"].replace("|", "\\|")[:160]
            cells += [f"FAILED: {reason}"] + [""] * 5
        else:
            pred_peak = ("" if "pred_peak_bytes" not in r
                         else _gib(r["pred_peak_bytes"]) + _err(r.get("peak_error")))
            pred_ms = ("" if "pred_step_time_s" not in r
                       else f"{r['pred_step_time_s'] * 1e3:.3g}" + _err(r.get("time_error")))
            cells += [f"{r['tokens_per_s']:,.0f}", f"{r['step_time_s'] * 1e3:.3g}", _gib(r["peak_bytes"]),
                      pred_peak, pred_ms, f"{r['warmup_s']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _label(r: dict) -> str:
    return f"{r['model']} {r['size']} {r['mode']}"


def plot(rows: list[dict], path: Path) -> str:
    """Two panels: throughput per (model, mode); measured vs predicted peak for colauto rows."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display on the GPU hosts
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: skipped the PNG plot"
    ok = [r for r in rows if not r["error"]]
    col = [r for r in ok if "pred_peak_bytes" in r]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.5))
    fig.set_figwidth(max(13, 0.6 * len(ok) + 6))  # room for one bar label per row
    a.bar(range(len(ok)), [r["tokens_per_s"] for r in ok], color=[f"C{MODES.index(r['mode'])}" for r in ok])
    a.set_xticks(range(len(ok)), [_label(r) for r in ok], fontsize=7, rotation=40, ha="right")
    a.set_ylabel("tokens/s")
    a.set_title("throughput")
    xs = range(len(col))
    b.bar([x - 0.2 for x in xs], [(r["peak_bytes"] or 0) / GiB for r in col], 0.4, label="measured")
    b.bar([x + 0.2 for x in xs], [r["pred_peak_bytes"] / GiB for r in col], 0.4, label="predicted")
    b.set_xticks(list(xs), [_label(r) for r in col], fontsize=7, rotation=40, ha="right")
    b.set_ylabel("peak GiB")
    b.set_title("peak memory, colauto rows" + ("" if any(r["peak_bytes"] for r in col) else " (measured n/a on CPU)"))
    b.margins(y=0.2)  # headroom so the legend doesn't cover the bars
    b.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path}"


def save(out: Path, env: dict, rows: list[dict]) -> None:
    # rewritten after every row, so a run cut short (timeout, crash) still leaves its results
    (out / "results.json").write_text(json.dumps(dict(environment=env, rows=rows), indent=1) + "\n")
    (out / "results.md").write_text(markdown(rows))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    out = Path(args.out) if args.out else default_out(args)
    out.mkdir(parents=True, exist_ok=True)
    args.out_dir = out
    env = environment(args, argv)
    matrix = [(spec, mode) for spec in args.models for mode in args.modes]
    rows: list[dict] = []
    for i, (spec, mode) in enumerate(matrix, 1):
        print(f"[{i}/{len(matrix)}] {spec['model']} {spec['size']} {mode} ... ", end="", flush=True)
        row = run_one(spec, mode, args)
        rows.append(row)
        print(f"FAILED: {row['error']}" if row["error"] else f"{row['tokens_per_s']:,.0f} tok/s", flush=True)
        save(out, env, rows)
    print("\n" + markdown(rows), flush=True)
    print(plot(rows, out / "results.png"))
    written = [f for f in ("results.json", "results.md", "results.png") if (out / f).exists()]
    print(f"results in {out}/ ({', '.join(written)})", flush=True)
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
