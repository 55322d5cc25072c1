"""Memory-budget sweep: colauto's rematerialization plans against Inductor's activation_memory_budget.

    python -m bench.remat_sweep --models gpt2:124m:16:1024 --out bench/results/<dir>
    python -m bench.remat_sweep --models hf/qwen2:bench:8:1024 --out bench/results/<dir>
    python -m bench.remat_sweep --out bench/results/<dir> --replot <dir>/*/sweep.json   # merge, plot

Per model: colauto (Inductor codegen, so plans are compared, not kernels) at budgets that leave 100%,
75% and 50% of the unconstrained activation memory (predicted peak minus parameters, gradients and
optimizer state) and at the smallest feasible budget; torch.compile's default backend with
torch._functorch.config.activation_memory_budget at each of --inductor-budgets. Writes sweep.json,
sweep.md and a Pareto plot (tokens/s against measured peak, one curve per system and model).
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

import colauto_backend
from bench.run import GiB, autocast, build_model, environment, parse_models, train


def colauto_budgets(model, make_inputs, spec, args) -> list[tuple[str, int]]:
    """(label, bytes): 100/75/50% of the predicted unconstrained activation memory, and the smallest
    (those of `args.points`)."""
    inputs = make_inputs(spec["batch"], spec["seq"])
    # a transformers model takes keyword arguments (build_model's inputs are then one dict)
    call = dict(kwargs=inputs[0]) if spec["model"].startswith("hf/") else {}
    args_ = () if call else inputs
    with autocast(args):
        # the same graph the runs compile: Inductor codegen means Inductor's decompositions
        prof = colauto_backend.profile(model, *args_, **call, options={"memory_budget": "none", "codegen": "inductor"})
        d = prof.details
        persistent = d["param_bytes"] + d["grad_bytes"] + d["optimizer_state_bytes"]
        activations = prof.peak_memory_bytes - persistent
        out = [(f"{p}% act", int(persistent + int(p) / 100 * activations)) for p in args.points if p != "smallest"]
        try:
            if "smallest" in args.points:
                colauto_backend.explain(model, *args_, **call, budget=1024, options={"codegen": "inductor"})
        except colauto_backend.BudgetError as err:
            out.append(("smallest", err.smallest_bytes))
    torch._dynamo.reset()
    return out


def run(spec, system: str, setting, args) -> dict:
    row = dict(spec, system=system, setting=setting[0] if system == "colauto" else setting, error=None)
    model = None
    backend = colauto_backend.backend
    compiles = lambda: (sum(backend.REPLANNED.values()), sum(backend.LOOSENED.values()),  # noqa: E731
                        sum(backend.LOOSER_OVER.values()))
    before = compiles()
    try:
        model, make_inputs, loss_of = build_model(spec, args.device)
        if system == "colauto":
            label, budget = setting
            options = {"codegen": "inductor", "memory_budget": budget}
            with_backend = lambda m: torch.compile(m, backend="colauto", options=options)  # noqa: E731
        else:
            with_backend = torch.compile
        patch = torch._functorch.config.patch(activation_memory_budget=float(setting) if system == "inductor" else 1.0)
        with patch:
            row.update(train(model, make_inputs, spec, "custom", args, compile_fn=with_backend, loss_of=loss_of))
        if system == "colauto":   # the plan the compiled step runs (the backend keeps its analyses)
            plan = colauto_backend.backend.ANALYSES[-1].plan
            row.update(budget_bytes=budget, pred_peak_bytes=plan.peak_with_bytes,
                       pred_step_s=plan.step_time_with_s, pred_recompute_s=plan.recompute_time_s,
                       plan_s=plan.plan_s, simulated_plans=plan.simulated_plans,
                       partitions_run=plan.partitions_run, model_misses=plan.model_misses)
            # the step planned and compiled again: over the budget, under more of it (well under it), and
            # looser plans that went over (the plan that held kept); `ANALYSES[-1]`: the plan that runs
            row.update(zip(("replanned", "loosened", "looser_over"), [b - a for a, b in zip(before, compiles())]))
            # the compiled code's peak read before the step ran: as the plan assumes (the model's outputs held to
            # the optimizer step), and as this script runs the step (bench.run's training_step keeps only the
            # loss of a model that returns more: an HF model's logits), the one to compare with the measured
            compiled = colauto_backend.backend.ANALYSES[-1].compiled_peak()
            dropped = colauto_backend.backend.ANALYSES[-1].compiled_peak(outputs_dropped=True)
            row["compiled_peak_bytes"] = compiled[0] if compiled else None
            row["compiled_dropped_bytes"] = dropped[0] if dropped else None
    except Exception as exc:  # noqa: BLE001 - a failed point is recorded, never dropped
        row["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:400]
    finally:
        del model
        torch._dynamo.reset()
        gc.collect()
        torch.cuda.empty_cache()
    return row


def markdown(rows) -> str:
    lines = ["| model | B | system | setting | tokens/s | measured peak GiB | budget GiB | predicted peak GiB "
             "| compiled code's peak GiB | predicted step ms | best Inductor tokens/s at <= this peak | warm-up s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head = f"| {r['model']} {r['size']} | {r['batch']} | {r['system']} | {r['setting']} |"
        if r["error"]:
            lines.append(head + f" FAILED: {r['error'][:150]} | | | | | | | |")
            continue
        gib = lambda k: f"{r[k] / GiB:.2f}" if r.get(k) else ""  # noqa: E731
        rival = best_inductor_at_or_below(rows, r) if r["system"] == "colauto" else None
        pred_ms = f"{r['pred_step_s'] * 1e3:.1f}" if r.get("pred_step_s") else ""
        # the compiled code's peak as this script runs the step (outputs dropped; sweeps before 2026-12-07
        # recorded it with the outputs held only)
        code = gib("compiled_dropped_bytes") or gib("compiled_peak_bytes")
        lines.append(head + f" {r['tokens_per_s']:,.0f} | {gib('peak_bytes')} | {gib('budget_bytes')} | "
                     f"{gib('pred_peak_bytes')} | {code} | {pred_ms} | {'' if rival is None else f'{rival:,.0f}'} | "
                     f"{r['warmup_s']:.0f} |")
    return "\n".join(lines) + "\n"


def best_inductor_at_or_below(rows, r) -> float | None:
    """The highest Inductor throughput, same model, whose measured peak is at or below row r's (the
    comparison the goal asks for: colauto should be at or above it)."""
    rivals = [x["tokens_per_s"] for x in rows if x["system"] == "inductor" and not x["error"]
              and (x["model"], x["size"], x["batch"]) == (r["model"], r["size"], r["batch"])
              and None not in (x["peak_bytes"], r["peak_bytes"]) and x["peak_bytes"] <= r["peak_bytes"]]
    return max(rivals, default=None)


def plot(rows, path: Path) -> None:
    """One panel per model: tokens/s against measured peak, a curve per system."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipped the Pareto plot")
        return
    ok = [r for r in rows if not r["error"]]
    models = sorted({(r["model"], r["size"], r["batch"]) for r in ok})
    if not models:
        return
    cols = min(3, len(models))
    nrows = -(-len(models) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.8 * nrows), squeeze=False)
    for ax, model in zip(axes.flat, models):
        for system in ("colauto", "inductor"):
            pts = sorted(((r["peak_bytes"] or 0) / GiB, r["tokens_per_s"], r["setting"]) for r in ok
                         if (r["model"], r["size"], r["batch"]) == model and r["system"] == system)
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-" if system == "colauto" else "s--",
                    label=system if system == "colauto" else "inductor activation_memory_budget")
            for x, y, label in pts:
                ax.annotate(str(label), (x, y), fontsize=7, textcoords="offset points", xytext=(3, 3))
        ax.set_title(f"{model[0]} {model[1]} B{model[2]}", fontsize=9)
        ax.set_xlabel("measured peak (GiB)")
        ax.set_ylabel("tokens/s")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(models):]:
        ax.axis("off")
    fig.suptitle("memory budget sweep: colauto plans vs Inductor activation_memory_budget", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def replot(sources: list[str], out: Path) -> int:
    """Merge the sweep.json files of earlier runs into one sweep.md and one plot (--replot)."""
    rows = []
    for src in sources:
        rows += json.loads(Path(src).read_text())["rows"]
    out.mkdir(parents=True, exist_ok=True)
    table = markdown(rows)
    (out / "sweep.md").write_text(table)
    plot(rows, out / "sweep.png")
    print(table)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=parse_models, default=parse_models("gpt2:124m:16:1024"))
    ap.add_argument("--inductor-budgets", default="1.0,0.7,0.5,0.3,0.1")
    ap.add_argument("--points", default="100,75,50,smallest",
                    help="colauto's budgets: percentages of the predicted activation memory, and/or smallest")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--replot", nargs="+", metavar="SWEEP_JSON",
                    help="run nothing: merge these sweep.json files into --out's sweep.md and sweep.png")
    args = ap.parse_args(argv)
    if args.replot:
        return replot(args.replot, Path(args.out))
    args.points = [p.strip() for p in args.points.split(",") if p.strip()]
    if bad := [p for p in args.points if p != "smallest" and not p.isdigit()]:
        ap.error(f"--points {bad}: use percentages (100,75,50) and/or smallest")
    args.device = "cuda" if torch.cuda.is_available() else "cpu"   # CPU: a smoke test only
    args.dtype = "bf16" if args.device == "cuda" else "fp32"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment(args, sys.argv[1:] if argv is None else list(argv), prog="bench.remat_sweep")
    rows = []
    for spec in args.models:
        model, make_inputs, _ = build_model(spec, args.device)
        points = [("colauto", b) for b in colauto_budgets(model, make_inputs, spec, args)]
        del model
        points += [("inductor", float(b)) for b in args.inductor_budgets.split(",")]
        for system, setting in points:
            t0 = time.perf_counter()
            row = run(spec, system, setting, args)
            rows.append(row)
            print(f"{spec['model']} {spec['size']} {system} {row['setting']}: "
                  + (f"FAILED {row['error']}" if row["error"] else
                     f"{row['tokens_per_s']:,.0f} tok/s, peak {(row['peak_bytes'] or 0) / GiB:.2f} GiB")
                  + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
            (out / "sweep.json").write_text(json.dumps(dict(environment=env, rows=rows), indent=1) + "\n")
            (out / "sweep.md").write_text(markdown(rows))
    plot(rows, out / "sweep.png")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
