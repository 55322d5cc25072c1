"""The memory model's predicted peak against the measured peak of a compiled training step, on CPU.

    python -m bench.cpu_peak --models qwen2,t5 --codegens aten,inductor --fractions 0.6 --out DIR

HF models from their tiny configs (examples/hf_zoo.py), fp32, batch 8 x 256 tokens (images 8 x 32 x 32),
so that activations, not parameters, make the peak. Each (model, codegen) is compiled with no budget,
then at each fraction f of the way from the parameters, gradients and AdamW state to that peak
(COLAUTO_MEMORY_BUDGET = held + f * (peak - held)). The measured peak is the step's third call
(steady state: AdamW's moments exist), replayed from the CPU allocator's own events (torch.profiler
with profile_memory: every allocation and free with its time, Inductor's wrapper allocations
included), plus what is allocated before the step (parameters, buffers, batch, AdamW state). The
step holds the model's outputs (the logits) until after the optimizer step, as the memory model
assumes. The predicted peak is the largest of the compiled graphs' (`peak_memory_bytes` of each
planned graph's analysis); the compiled code's, where Inductor generated every graph's code, is the
step's peak with its graphs run as their generated wrappers allocate (`Analysis.compiled_peak`). Writes peaks.json to DIR and prints one line per point; exit status 0
whatever the error (this measures, it does not judge).

CPU only: GPU peaks come from bench.run (torch.cuda.max_memory_allocated) on a GPU host.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# codegen triton runs its kernels in Triton's interpreter here (CPU tensors); set before triton is imported
os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402


def measured_step(model, batch: dict, options: dict, drop_outputs: bool = False) -> tuple[int, list]:
    """(measured peak bytes of the third step, the planned analyses of its compile). `drop_outputs`: the
    step keeps only the loss (`loss = model(**batch).loss`), not the model's output until after the
    optimizer step."""
    from colauto_backend import backend as backend_mod
    torch._dynamo.reset()
    backend_mod.ANALYSES.clear()
    compiled = torch.compile(model, backend="colauto", options=options)
    opt = torch.optim.AdamW(model.parameters(), fused=True)

    def step():
        out = compiled(**batch)
        loss = out.loss
        if drop_outputs:
            del out
            out = None
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del out
    import torch._inductor.config as inductor_config
    # every graph is generated anew (no cache), so that its generated code's allocations are read
    with inductor_config.patch(force_disable_caches=True):
        step()
    step()
    held = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers(), *batch.values()]
               + [v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)])
    peak, _, _ = allocated(step)
    return held + peak, [a for a in backend_mod.ANALYSES if a.planner is not None]


def allocated(fn) -> tuple[int, int, object]:
    """(the most bytes the CPU allocator had out at once while `fn()` ran, the bytes still out when it returned,
    both counted from its start; its result), replayed from the allocator's own events (torch.profiler with
    profile_memory)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation:
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    live = peak = 0
    for _, delta in sorted(events):
        live += delta
        peak = max(peak, live)
    return peak, live, result


def graph_break(model: torch.nn.Module, where: str) -> None:
    """Make Dynamo split the model's step, as a user's print or logging call would: `head`, before its output
    embedding (a forward pre-hook: the body, the output embedding and the loss become three graphs); `layer`,
    after the first layer of its first ModuleList (Dynamo then compiles that layer's frame once and runs it
    for every layer)."""
    if where == "head":
        model.get_output_embeddings().register_forward_pre_hook(lambda m, args: torch._dynamo.graph_break())
    elif where == "layer":
        stack = next(m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m))
        stack[0].register_forward_hook(lambda m, args, out: torch._dynamo.graph_break())
    else:
        raise ValueError(f"--graph-break {where!r}: use head or layer")


def broken_hf(name: str, where: str, layers: int | None = None):
    """(model, batch) of examples/hf_zoo.py's tiny `name`, with `layers` decoder layers if given (its config's
    num_hidden_layers), seeded, split by a graph break at `where` (`graph_break`)."""
    import transformers

    from examples.hf_zoo import SPECS, build_hf, config_of
    model, make = build_hf(name)
    if layers is not None:
        config = config_of(name)
        config.num_hidden_layers = layers
        torch.manual_seed(0)
        model = getattr(transformers, SPECS[name].model)(config).train()
    graph_break(model, where)
    return model, make


def points(name: str, codegen: str, fractions: list[float], drop_outputs: bool = False,
           broken: str | None = None) -> list[dict]:
    """One row per point: no budget, then each fraction of the way from the held state to its peak.
    `broken`: where a graph break splits the step (`graph_break`)."""
    from examples.hf_zoo import SPECS, build_hf
    torch.manual_seed(0)
    model, make = build_hf(name)
    if broken is not None:
        graph_break(model, broken)
    batch = make(8, 32) if SPECS[name].kind == "image" else make(8, 256)
    rows, base = [], None
    for fraction in [None, *fractions]:
        row = {"model": name, "codegen": codegen, "fraction": fraction}
        options = {"codegen": codegen}
        if fraction is not None:
            if base is None:
                break
            options["memory_budget"] = row["budget_bytes"] = int(base[1] + fraction * (base[0] - base[1]))
        from colauto_backend import _torch_compat as compat, backend, split_step
        refused = sum(compat.RECOMPUTE_KEPT_APART.values())
        split = [sum(c.values()) for c in (split_step.SHORT, split_step.REPLANNED, split_step.UNHELD, split_step.RERUN)]
        again = (sum(backend.REPLANNED.values()), sum(backend.FUSION_REFUSED_AGAIN.values()),
                 sum(backend.LOOSENED.values()), sum(backend.LOOSER_OVER.values()))
        try:
            measured, planned = measured_step(model, batch, options, drop_outputs)
        except Exception as exc:  # noqa: BLE001 - recorded as the point's result
            rows.append(row | {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]})
            continue
        evs = [a.evaluate(a.hints) for a in planned]
        predicted = max(ev["peak_memory_bytes"] for ev in evs)
        # the peak with each graph run as Inductor's generated code allocates (None: not compiled by Inductor)
        compiled = [a.compiled_peak(outputs_dropped=drop_outputs) for a in planned]
        if compiled and all(c is not None for c in compiled):
            row["compiled_bytes"] = max(c[0] for c in compiled)
            row["compiled_error_pct"] = 100 * (row["compiled_bytes"] / measured - 1)
        if fraction is None:
            # a split step's own graphs' peaks do not add up to its peak: the fractions are of the measured one
            base = (measured if broken is not None else predicted,
                    evs[0]["param_bytes"] + evs[0]["grad_bytes"] + evs[0]["optimizer_state_bytes"])
            if broken is None and len(evs) > 1:
                # split by the model itself (HF OPT under transformers 5.17): from the measured peak, and what the
                # whole model holds (each parameter, its gradient and AdamW's two moments), not the first graph's
                base = (measured, 4 * sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad))
        rows.append(row | {"measured_bytes": measured, "predicted_bytes": predicted, "graphs": len(evs),
                           "recomputed": sum(len(a.recomputed) for a in planned),
                           "error_pct": 100 * (predicted / measured - 1),
                           "over_budget": fraction is not None and measured > row["budget_bytes"],
                           # horizontal fusions of a recomputation refused (compat._as_planned)
                           "fusions_refused": sum(compat.RECOMPUTE_KEPT_APART.values()) - refused,
                           # compiles again (backend._held_to_budget): re-planned under a margin, and (auto
                           # rules) the same plan with Inductor's fusions of recomputation refused
                           "replanned": sum(backend.REPLANNED.values()) - again[0],
                           "fusion_refused_again": sum(backend.FUSION_REFUSED_AGAIN.values()) - again[1],
                           # planned again under more of the budget (the compiled step well under it), and
                           # those looser plans that went over it (the plan that held kept)
                           # a step split at a graph break (split_step): graphs that fell short of what the
                           # earlier left, graphs planned again, graphs that could not leave the room, and
                           # graphs run for each layer
                           "split": dict(zip(("short", "replanned", "unheld", "rerun"),
                                             (sum(c.values()) - k for c, k in zip(
                                                 (split_step.SHORT, split_step.REPLANNED, split_step.UNHELD,
                                                  split_step.RERUN), split)))),
                           "loosened": sum(backend.LOOSENED.values()) - again[2],
                           "looser_over": sum(backend.LOOSER_OVER.values()) - again[3]})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="qwen2,llama,gpt2,t5,bert", help="examples/hf_zoo.py names")
    ap.add_argument("--codegens", default="aten,inductor")
    ap.add_argument("--fractions", default="0.6", help="budgets, as fractions (comma-separated; empty: none)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--drop-outputs", action="store_true",
                    help="the step keeps only the loss, not the model's output until after the optimizer step "
                         "(the memory model's assumption); compiled_bytes is then the compiled peak for such a step")
    ap.add_argument("--graph-break", choices=["head", "layer"], default=None,
                    help="split each model's step with a graph break: before its output embedding, or after its "
                         "first layer (bench.cpu_peak.graph_break); budgets are then fractions of the measured peak")
    ap.add_argument("--no-inductor-buffer-reuse", action="store_true",
                    help="a diagnostic: torch._inductor.config.allow_buffer_reuse=False for every compile (Inductor "
                         "then neither holds a freed buffer for a later same-size one nor reuses it at the next "
                         "kernel); colauto itself leaves it on")
    args = ap.parse_args(argv)
    if args.no_inductor_buffer_reuse:
        import torch._inductor.config as inductor_config
        inductor_config.allow_buffer_reuse = False
    os.environ["COLAUTO_PLAN_CACHE"] = "0"         # every point plans
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    torch.set_num_threads(1)   # Inductor's CPU scatter-add is exact only on one thread (tests/test_hf_models.py)
    fractions = [float(f) for f in args.fractions.split(",") if f]
    rows = []
    for name in args.models.split(","):
        for codegen in args.codegens.split(","):
            for row in points(name, codegen, fractions, args.drop_outputs, args.graph_break):
                rows.append(row)
                where = f"{name:10s} {codegen:9s} {row['fraction'] or 'none':>5}"
                if "error" in row:
                    print(where, row["error"], flush=True)
                    continue
                print(f"{where} measured {row['measured_bytes'] / 2**20:8.2f} MiB  predicted "
                      f"{row['predicted_bytes'] / 2**20:8.2f} MiB  ({row['error_pct']:+.1f}%)"
                      + (f"  compiled code {row['compiled_bytes'] / 2**20:8.2f} MiB ({row['compiled_error_pct']:+.1f}%)"
                         if "compiled_bytes" in row else "")
                      + (f"  fusions refused {row['fusions_refused']}, compiled again: fusion rule "
                         f"{row['fusion_refused_again']}, re-planned {row['replanned']}, loosened {row['loosened']} "
                         f"(over: {row['looser_over']}), budget {row['budget_bytes'] / 2**20:.2f} MiB, "
                         f"{row['recomputed']} ops recomputed" if row["fraction"] is not None else "")
                      + (f"  split step: {row['split']}" if args.graph_break or any(row["split"].values()) else "")
                      + ("  MEASURED ABOVE THE BUDGET" if row["over_budget"] else ""), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "peaks.json").write_text(json.dumps({"torch": torch.__version__, "rows": rows, "graph_break": args.graph_break,
                                                "inductor_buffer_reuse": not args.no_inductor_buffer_reuse}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
