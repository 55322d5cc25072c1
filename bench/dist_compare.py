"""colauto's automatic parallel plan against hand-written DDP, FSDP2 and tensor parallel, all compiled.

    torchrun --nproc-per-node 4 -m bench.dist_compare --model gpt2:774m --batch 8 --seq 1024 --out /tmp/d
    torchrun --nproc-per-node 4 -m bench.dist_compare --model hf/llama:bench --batch 4 --configs colauto,ddp,fsdp2 --out /tmp/d
    python -m bench.dist_compare --summarize --out /tmp/d          # summary.md of the folder

--model is the project's zoo (`gpt2:774m`) or a transformers model of examples/hf_zoo.py (`hf/llama:bench`,
called as `model(input_ids=x, labels=x).loss`); tensor parallel (`tp`) is for the zoo's models only.

Every configuration trains the same global batch (--batch per GPU times the GPUs), bf16 autocast,
fused AdamW, Inductor code generation (on a machine without CUDA: gloo, fp32, for a dry run): colauto (COLAUTO_CODEGEN=inductor, its automatic mesh), DDP +
torch.compile, FSDP2 (fully_shard per block) + torch.compile, and tensor parallel
(parallelize_module: Megatron column/row pairs, DTensor activations) + torch.compile, where each rank of
the tp group runs the whole global batch. Writes one JSON per configuration on rank 0: tokens/s per GPU,
measured peak memory (max over ranks, less what earlier configurations of the process still hold),
colauto's predicted peak and plan, or the error that stopped it. Peaks are given over the whole run (the model's build, the first call and
the warm-up included) and over the timed steps alone.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import glob
import json
import os
import time
import traceback

for _var, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                     ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_var, _value)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.tensor.experimental import implicit_replication  # noqa: E402

import colauto_backend  # noqa: E402
from examples import hf_zoo  # noqa: E402
from examples.models import build  # noqa: E402

if "colauto" not in torch._dynamo.list_backends(exclude_tags=()):
    torch._dynamo.register_backend(colauto_backend.colauto, name="colauto")

CONFIGS = ("colauto", "ddp", "fsdp2", "tp")
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def linear_roles(model: nn.Module) -> dict[str, str]:
    """Megatron pairs for the zoo's models (module path -> colwise/rowwise)."""
    roles = {}
    for name, mod in model.named_modules():
        leaf = name.rpartition(".")[2]
        if leaf in ("fc", "q", "k", "v", "gate", "up"):
            roles[name] = "col"
        elif leaf in ("down", "o") or (leaf == "proj" and name.endswith("mlp.proj")):
            roles[name] = "row"
    return roles


def blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated layers FSDP2 wraps one by one: the elements of every ModuleList of several modules
    (GPT-2's blocks, a transformers model's decoder layers, T5's encoder and decoder blocks)."""
    return [m for lst in model.modules() if isinstance(lst, nn.ModuleList) and len(lst) > 1 for m in lst]


def build_model(spec: str):
    """(model, batch(B, T) -> the call's arguments (a dict: keywords), loss of the call's output)."""
    if spec.startswith("hf/"):
        name, size = spec[3:].split(":")
        model, batch = hf_zoo.build_hf(name, size, device=DEVICE)
        return model, batch, hf_zoo.loss_of
    name, size = spec.split(":")
    model, make = build(name, size, device=DEVICE)

    def batch(b: int, t: int) -> tuple:
        return tuple(x.to(DEVICE) for x in make(b, t))
    return model, batch, lambda out: out


def prepare(kind: str, model: nn.Module, world: int):
    """(module to call, batch multiplier) for a hand-written configuration."""
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        return torch.compile(DDP(model, device_ids=[torch.cuda.current_device()] if CUDA else None)), 1
    if kind == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for block in blocks(model):
            fully_shard(block)
        fully_shard(model)
        return torch.compile(model), 1
    if kind == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        mesh = init_device_mesh("cuda" if CUDA else "cpu", (world,))
        styles = {n: ColwiseParallel(use_local_output=False) if r == "col" else RowwiseParallel()
                  for n, r in linear_roles(model).items()}
        parallelize_module(model, mesh, styles)
        return torch.compile(model), world          # every tp rank runs the whole global batch
    # colauto, or colauto@MESH for a forced mesh (COLAUTO_MESH's form without commas, e.g. colauto@tp=4)
    options = {"codegen": "inductor"} | ({"mesh": kind.split("@", 1)[1]} if "@" in kind else {})
    return torch.compile(model, backend="colauto", options=options), 1


def run(kind: str, args, rank: int, world: int) -> dict:
    torch._dynamo.reset()
    gc.collect()
    if CUDA:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    # What an earlier configuration in this process still holds is not this one's: subtract it.
    leftover = torch.cuda.memory_allocated() if CUDA else 0
    build_start = time.perf_counter()
    model, make, loss_of = build_model(args.model)
    sync()
    build_s = time.perf_counter() - build_start
    if kind == "tp" and args.model.startswith("hf/"):
        raise ValueError("the hand-written tp configuration knows the zoo's module names only")
    fn, mult = prepare(kind, model, world)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=CUDA)
    # every rank its own micro-batch (tp: the group's whole batch), as a data loader would give it
    inputs = make(args.batch * mult * world, args.seq)
    if mult == 1:
        inputs = ({k: v.chunk(world)[rank] for k, v in inputs.items()} if isinstance(inputs, dict)
                  else tuple(v.chunk(world)[rank] for v in inputs))
    def one_step():
        # tp: plain tensors (RoPE tables made in forward, the parameters parallelize_module left alone,
        # which fused AdamW steps together with the DTensor ones) count as replicated
        with implicit_replication() if kind == "tp" else contextlib.nullcontext():
            with torch.autocast("cuda", torch.bfloat16) if CUDA else torch.autocast("cpu", enabled=False):
                loss = loss_of(fn(**inputs) if isinstance(inputs, dict) else fn(*inputs))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return loss

    compile_start = time.perf_counter()
    times, whole_peak, allocs, steady = [], 0, {}, 0
    for step in range(args.warmup + args.steps):
        sync()
        if step == args.warmup and CUDA:    # the timed steps' own peak: no build, no first call
            whole_peak = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            allocs = torch.cuda.memory_stats()
            steady = torch.cuda.memory_allocated()    # what stays between steps: parameters, optimizer state
        start = time.perf_counter()
        loss = one_step()
        sync()
        times.append(time.perf_counter() - start)
        if step == 0:
            compile_s = time.perf_counter() - compile_start
    if CUDA:    # the caching allocator's work in the timed steps: retries and cudaMalloc/cudaFree calls
        now = torch.cuda.memory_stats()
        allocs = {k: now.get(k, 0) - allocs.get(k, 0)
                  for k in ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams")}
        # the bytes asked for at the timed steps' peak (allocated bytes round each block up to 512 B),
        # and what stays allocated between steps: the predicted peak is of requested bytes
        allocs |= {"requested_peak_bytes": now.get("requested_bytes.all.peak", 0), "steady_bytes": steady}
    timed = sorted(times[args.warmup:])
    median = timed[len(timed) // 2]
    # peak over the whole run (build, first call, warm-up) before the reset above, and over the timed steps
    timed_peak = torch.cuda.max_memory_allocated() if CUDA else leftover
    peak = torch.tensor([max(whole_peak, timed_peak) - leftover, timed_peak - leftover], device=DEVICE)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    # the ranks' mean of the last loss (DDP and FSDP2 return each rank's own; colauto the mean already)
    last = torch.tensor([float(loss.detach().float().item() if not hasattr(loss, "full_tensor")
                               else loss.full_tensor())], device=DEVICE)
    dist.all_reduce(last)
    # tokens/s per GPU: the global batch's tokens per step over the GPUs (the same for every config)
    out = {"config": kind, "tokens_per_s_per_gpu": args.batch * args.seq / median, "step_s": median,
           "steps_s": times, "peak_bytes": int(peak[0].item()), "peak_timed_bytes": int(peak[1].item()),
           "build_s": build_s, "compile_first_step_s": compile_s,
           "loss": float(last.item()) / world, "allocator_in_timed_steps": allocs}
    if args.profile:
        trace = None if args.trace is None or rank != 0 else os.path.join(
            args.trace, f"{model_tag(args.model)}-{config_label(kind)}.json")
        out["profile"] = profile_step(one_step, trace)
    if kind.startswith("colauto"):
        from colauto_backend.parallel.entry import PLANS, SHARDED
        plan = PLANS[-1]
        sharded = next((s for s in SHARDED if s.plan is plan), None)   # none: data parallelism
        out.update(plan_mesh=plan.mesh_str, predicted=plan.predicted,
                   grad_fallbacks=sharded.grad_fallbacks if sharded else 0)
    del model, fn, opt
    return out


def model_tag(model: str) -> str:
    """hf/llama:bench -> hf-llama-bench (file names)."""
    return model.replace(":", "-").replace("/", "-")


def config_label(kind: str) -> str:
    """colauto@tp=4 -> colauto-tp4 (file names)."""
    return kind.replace("@", "-").replace("=", "")


COMM = ("nccl",)
GEMM = ("gemm", "nvjet", "xmma", "cutlass", "matmul")
ATTENTION = ("flash", "fmha", "attention", "cudnn")


def profile_step(one_step, trace: str | None = None) -> dict:
    """One more step under torch.profiler: its GPU time by kind (collectives, GEMMs, attention, the rest),
    how much of the collectives' time no compute kernel overlaps, and the 25 costliest kernels (this rank).
    With `trace`, the step's Chrome trace is also written there (gzipped: `trace` + ".gz")."""
    from torch.profiler import ProfilerActivity, profile
    from bench.kernel_profile import gpu_events, intervals, overlap_us, union_us
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        one_step()
        sync()
    if trace is not None:       # a profile exports its trace once: read the events from that file
        import gzip
        import shutil
        os.makedirs(os.path.dirname(trace) or ".", exist_ok=True)
        prof.export_chrome_trace(trace)
        evs = gpu_events(prof, exported=trace)
        with open(trace, "rb") as src, gzip.open(trace + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.remove(trace)
    else:
        evs = gpu_events(prof)
    comm = [e for e in evs if any(k in e["name"].lower() for k in COMM)]
    compute = [e for e in evs if not any(k in e["name"].lower() for k in COMM)]

    def kind_ms(keys):
        return sum(float(e["dur"]) for e in compute if any(k in e["name"].lower() for k in keys)) / 1e3
    comm_iv, compute_iv = intervals(comm), intervals(compute)
    span = (max(float(e["ts"]) + float(e["dur"]) for e in evs) - float(evs[0]["ts"])) / 1e3 if evs else 0.0
    per_kernel: dict[str, list] = {}
    for e in evs:
        acc = per_kernel.setdefault(e["name"][:120], [0, 0.0])
        acc[0] += 1
        acc[1] += float(e["dur"]) / 1e3
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1][1])[:25]
    return {"span_ms": span, "busy_ms": union_us(evs) / 1e3, "kernels": len(evs),
            "compute_busy_ms": union_us(compute) / 1e3, "gemm_ms": kind_ms(GEMM), "attention_ms": kind_ms(ATTENTION),
            "comm_ms": sum(float(e["dur"]) for e in comm) / 1e3, "comm_busy_ms": union_us(comm) / 1e3,
            "comm_exposed_ms": (union_us(comm) - overlap_us(comm_iv, compute_iv)) / 1e3, "collectives": len(comm),
            "top_kernels": [{"name": n, "calls": c, "ms": round(ms, 3)} for n, (c, ms) in top]}


def summarize(directory: str) -> str:
    """summary.md for a folder of this script's JSON files (one row per file)."""
    rows, meta = [], None
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        d = json.load(open(path))
        meta = meta or d
        label = os.path.basename(path)[:-5].split("gpu-", 1)[1]
        if "error" in d:
            lines = d["error"].splitlines()     # Dynamo wraps the backend's error: show the inner one
            rows.append(f"| {d['model']} | {label} | {next((x for x in lines[1:] if 'Error' in x), lines[0])} | | | | |")
            continue
        step = d["batch_per_gpu"] * d["seq"] / d["tokens_per_s_per_gpu"]
        p = d.get("predicted")
        timed = f" / {d['peak_timed_bytes'] / 2**30:.2f}" if "peak_timed_bytes" in d else ""
        rows.append(f"| {d['model']} | {label} | {d['tokens_per_s_per_gpu']:,.0f} | {d['peak_bytes'] / 2**30:.2f}{timed} | "
                    + (f"{p['memory_bytes'] / 2**30:.2f} | {p['step_time_s'] * 1e3:.0f} / {step * 1e3:.0f} | "
                       f"{d['plan_mesh']} |" if p else f" | - / {step * 1e3:.0f} | |"))
    head = [f"{meta['gpus']}x {meta['card']}, torch {meta['torch']}, {meta['date']}: bf16 autocast, fused AdamW, "
            f"T={meta['seq']}, micro-batch {meta['batch_per_gpu']} per GPU (the same global batch for every "
            "configuration), median of the timed steps.", "",
            "| model | configuration | tokens/s per GPU | measured peak GiB, whole run / timed steps (max over ranks) "
            "| predicted peak GiB "
            "| predicted / measured step ms | colauto mesh |", "|---|---|---|---|---|---|---|"]
    return "\n".join(head + rows) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2:774m")
    ap.add_argument("--batch", type=int, default=8, help="micro-batch per GPU")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", action="store_true",
                    help="after the timed steps, profile one more step (CUDA): GPU time by kind, exposed collectives")
    ap.add_argument("--trace", metavar="DIR",
                    help="with --profile: also write the profiled step's Chrome trace (rank 0) to DIR, gzipped")
    ap.add_argument("--summarize", action="store_true", help="only write OUT/summary.md from OUT's JSON files")
    args = ap.parse_args()
    if args.summarize:
        with open(os.path.join(args.out, "summary.md"), "w") as f:
            f.write(summarize(args.out))
        return
    for kind in args.configs.split(","):
        if kind not in CONFIGS and not kind.startswith("colauto@"):
            ap.error(f"--configs: {kind!r} is not one of {', '.join(CONFIGS)} or colauto@MESH (e.g. colauto@tp=4)")
    if args.trace and not args.profile:
        ap.error("--trace writes the --profile step's trace: add --profile")
    if args.profile and not CUDA:
        ap.error("--profile needs CUDA (it times kernels); run without it on a machine without a GPU")
    if CUDA:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if CUDA else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    os.makedirs(args.out, exist_ok=True)
    meta = {"model": args.model, "batch_per_gpu": args.batch, "seq": args.seq, "gpus": world,
            "card": torch.cuda.get_device_name() if CUDA else "cpu", "torch": torch.__version__,
            "date": datetime.date.today().isoformat()}
    for kind in args.configs.split(","):
        try:
            result = run(kind, args, rank, world)
        except Exception as exc:  # noqa: BLE001 - recorded, the sweep goes on
            result = {"config": kind, "error": f"{type(exc).__name__}: {exc}"[:2000],
                      "trace": traceback.format_exc()[-3000:]}
        if rank == 0:
            with open(os.path.join(args.out, f"{model_tag(args.model)}-{world}gpu-{config_label(kind)}.json"), "w") as f:
                json.dump(meta | result, f, indent=1, default=str)
            print(json.dumps({k: v for k, v in result.items() if k not in ("steps_s", "trace", "predicted")},
                             default=str), flush=True)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
