"""Which buffers are live at a compiled training step's measured peak (CUDA).

    python -m bench.peak_snapshot --model gpt2:124m:16:1024 --budget 4.7GiB --out DIR
    python -m bench.peak_snapshot --model hf/gpt2:bench:8:1024 --budget none --out DIR
    python -m bench.peak_snapshot --model hf/llama:bench:4:1024 --budget 17.1GiB --codegen triton --out DIR

Runs the step under colauto (codegen inductor, or the given --codegen, at the given COLAUTO_MEMORY_BUDGET; "inductor" for
torch.compile's default backend; "none" for colauto without a budget), records the allocator history of one steady-state step, replays it
to find the peak and writes the live allocations there (size, allocating source line) to peak.txt,
with the generated Inductor modules those lines come from. With --held, the allocator records from before
the compile instead, and held.txt lists what is allocated at the end of the step (held between steps:
parameters, optimizer state, and anything else) with the Python frames that allocated it. Under colauto
(without --held) it also writes predicted.txt:
the memory model's storages live at its predicted peak (`cost.memory.live_at_peak`, the node that made
each), for the graph compiled last (the step's, where it has one graph); and compiled.txt: the buffers
live at the peak of the compiled code (`cost.memory.compiled_live_at_peak`). For checking the memory
model by hand.
"""
from __future__ import annotations

import argparse
import linecache
import shutil
import sys
from pathlib import Path

import torch

from bench.run import GiB, build_model, make_optimizer, parse_models, training_step
from colauto_backend import config
from colauto_backend.backend import ANALYSES, make_backend
from colauto_backend.cost import memory


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=parse_models, default=parse_models("gpt2:124m:16:1024"))
    ap.add_argument("--budget", default="inductor")
    ap.add_argument("--out", required=True)
    ap.add_argument("--codegen", default="inductor", choices=("inductor", "triton"),
                    help="colauto's codegen (triton: Inductor compiles the rest on CUDA)")
    ap.add_argument("--held", action="store_true", help="record from before the compile; write held.txt")
    args = ap.parse_args(argv)
    if args.held:
        torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    args.device, args.dtype = "cuda", "bf16"
    spec = args.model[0]
    model, make_inputs, loss_of = build_model(spec, "cuda")   # the zoo's models or hf/<name>
    x, *rest = make_inputs(spec["batch"], spec["seq"])
    targets = rest[0] if rest else None
    options = {"codegen": args.codegen, "memory_budget": args.budget}
    fn = torch.compile(model) if args.budget == "inductor" else \
        torch.compile(model, backend=make_backend(config.load(options)))
    opt = make_optimizer(model, "cuda")
    # (fw, bw, settings, live set) of each partition the memory model simulated. The live set is taken at
    # once: the backward's compile later rewrites its graph (output_grads' zeros for the skipped logits
    # gradient, which Inductor folds away but the model would count), so a simulation after the step
    # would not be the planner's (2.3 GiB over it on HF Qwen2). Static shapes: no size hints needed.
    simulated = []
    real_simulate = memory.simulate_step

    def live_set(fw, bw, kw, hints):
        return memory.live_at_peak(fw, bw, param_indices=kw["param_indices"], num_fwd_outputs=kw["num_fwd_outputs"],
                                   device=kw["device"], optimizer=kw["optimizer"], hints=hints, fused=kw["fused"])

    def recording(fw, bw, **kw):
        live = None
        try:
            live = live_set(fw, bw, kw, {})
        except Exception as e:  # symbolic sizes (TypeError): simulated after the step, at the analysis' hints
            print(f"peak_snapshot: the live set is simulated after the step ({type(e).__name__}: {e})"[:200])
        simulated.append((fw, bw, kw, live))
        return real_simulate(fw, bw, **kw)
    memory.simulate_step = recording

    def step():
        training_step(fn, opt, x, targets, args, loss_of)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    if not args.held:
        torch.cuda.memory._record_memory_history(max_entries=200000)
    step()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.held:
        write_held(snap, out / "held.txt")
        return write_holders(model, opt, out / "holders.txt")
    events = [e for trace in snap["device_traces"] for e in trace]
    live: dict[int, dict] = {}
    base = sum(b["size"] for seg in snap["segments"] for b in seg["blocks"]
               if b["state"] == "active_allocated")   # allocated at snapshot end
    # replay from the state before the step: blocks freed during the step were allocated before it
    current = peak = 0
    peak_live: list = []
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = e
            current += e["size"]
        elif e["action"] == "free_completed" and e["addr"] in live:
            current -= live.pop(e["addr"])["size"]
        if current > peak:
            peak, peak_live = current, list(live.values())
    files = set()
    lines = [f"max_memory_allocated over the step {torch.cuda.max_memory_allocated() / GiB:.3f} GiB",
             f"end-of-step allocated {base / GiB:.3f} GiB; peak of allocations made during the step "
             f"{peak / GiB:.3f} GiB over what was live before it", ""]
    for e in sorted(peak_live, key=lambda e: -e["size"]):
        frame = next((f for f in e.get("frames", []) if "torchinductor" in f["filename"] or
                      "/colauto" in f["filename"] or "examples" in f["filename"]), None)
        where = ""
        if frame:
            files.add(frame["filename"])
            where = f"{Path(frame['filename']).name}:{frame['line']} {linecache.getline(frame['filename'], frame['line']).strip()}"
        lines.append(f"{e['size'] / 2**20:10.1f} MiB  {where}")
    (out / "peak.txt").write_text("\n".join(lines) + "\n")
    if simulated and ANALYSES:
        fw, bw, kw, live_then = simulated[-1]            # the partition of the plan compiled last
        analysis = ANALYSES[-1]
        peak_b, where, live = live_then or live_set(fw, bw, kw, analysis.hints)
        rows = [f"predicted peak {peak_b / GiB:.3f} GiB at {where} (the analysis: "
                f"{analysis.evaluate(analysis.hints)['peak_memory_bytes'] / GiB:.3f} GiB); "
                f"{len(ANALYSES)} graphs analysed, this is the last", ""]
        rows += [f"{b / 2**20:10.1f} MiB  {name}" for name, b in live]
        (out / "predicted.txt").write_text("\n".join(rows) + "\n")
        print("\n".join(rows[:40]))
        if set(analysis.allocations) == set(analysis.timeline.before):   # Inductor's code of every graph was read
            peak_c, where_c, live_c = memory.compiled_live_at_peak(
                analysis.timeline, analysis.allocations, analysis.basis.values(analysis.hints), analysis.device.alloc_round)
            rows = [f"peak of the compiled code {peak_c / GiB:.3f} GiB at {where_c} (`Analysis.compiled_peak`: each "
                    "graph run as its generated wrapper allocates and frees); live there:", ""]
            rows += [f"{b / 2**20:10.1f} MiB  {name}" for name, b in live_c]
            (out / "compiled.txt").write_text("\n".join(rows) + "\n")
            print("\n".join(rows[:40]))
    for f in files:
        if Path(f).exists():
            shutil.copy(f, out / Path(f).name)
    print("\n".join(lines[:40]))
    return 0


def write_held(snap: dict, path: Path) -> int:
    """Blocks allocated at the snapshot, largest first, each with the innermost Python frames that made it
    (outside torch's own modules and functional wrappers), and the total per allocating site."""
    blocks = [b for seg in snap["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"]
    lines = [f"allocated at the end of the step: {sum(b['size'] for b in blocks) / GiB:.3f} GiB in {len(blocks)} blocks", ""]
    sites: dict[str, list[int]] = {}
    for b in blocks:
        frames = [f for f in b.get("frames", []) if f["filename"].endswith(".py")]
        own = [f for f in frames if "/torch/" not in f["filename"] or "/torch/_inductor/" in f["filename"]
               or "/torch/_functorch/" in f["filename"]][:6]
        site = " <- ".join(f"{Path(f['filename']).name}:{f['line']}({f['name']})" for f in own) or "(no frames)"
        sites.setdefault(site, []).append(b["size"])
    for site, sizes in sorted(sites.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"{sum(sizes) / 2**20:10.1f} MiB  {len(sizes):5d} blocks  {site}")
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:40]))
    return 0


def write_holders(model, opt, path: Path, min_bytes: int = 256 * 2**20) -> int:
    """Who holds each large CUDA tensor that is neither a parameter, a gradient nor optimizer state: the
    chain of Python referrers (3 levels), and the allocated bytes before and after a garbage collection
    (a drop means a reference cycle held it)."""
    import gc
    own = {id(p) for p in model.parameters()} | {id(t) for st in opt.state.values() for t in st.values()
                                                 if isinstance(t, torch.Tensor)}
    before = torch.cuda.memory_allocated()
    found = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.is_cuda and id(o) not in own
             and o.untyped_storage().nbytes() >= min_bytes]
    lines = [f"large CUDA tensors held outside the model and optimizer: {len(found)}"]
    for t in found:
        lines.append(f"- {tuple(t.shape)} {t.dtype} {t.untyped_storage().nbytes() / 2**20:.1f} MiB")
        level = [t]
        for depth in range(3):
            nxt = []
            for o in level:
                for r in gc.get_referrers(o):
                    if r is level or r is found or r is lines or type(r).__name__ == "frame" and r.f_code.co_name == "write_holders":
                        continue
                    desc = type(r).__name__
                    if isinstance(r, dict):
                        desc += " keys " + ", ".join(map(str, list(r)[:6]))
                    elif hasattr(r, "__qualname__"):
                        desc += " " + r.__qualname__
                    elif type(r).__name__ == "cell":
                        desc += " (closure cell)"
                    lines.append("  " * (depth + 2) + desc[:200])
                    nxt.append(r)
            level = nxt[:8]
    del found
    gc.collect()
    lines.append(f"allocated {before / 2**30:.3f} GiB; after gc.collect() {torch.cuda.memory_allocated() / 2**30:.3f} GiB")
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:60]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
