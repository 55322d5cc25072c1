"""COLAUTO_REPORT output: a per-layer table and totals (printed on rank 0), or the same as JSON."""
from __future__ import annotations

import json
import warnings
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .analysis import Analysis


_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    """A Python warning, given once per process for each distinct message (fallbacks the user should see)."""
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, stacklevel=3)


def _rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def fmt_flops(n: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f}"


def summary(analysis: "Analysis", subs: dict | None = None) -> dict:
    """The report as plain data: totals, per-layer rows, sizes and unknown-cost ops."""
    subs = analysis.hints if subs is None else subs
    ev = analysis.evaluate(subs)
    totals = {k: v for k, v in ev.items() if not k.startswith("_")}
    sizes = {str(analysis.names.get(s, s)): v for s, v in subs.items()}
    return {"device": analysis.device.name, "codegen": analysis.codegen, "optimizer": analysis.optimizer, "sizes": sizes,
            "totals": totals, "layers": analysis.layers(subs, ev),
            "cost_model_s": analysis.cost_s,
            "plan": analysis.plan.to_dict() if analysis.plan is not None else None}


def render(data: dict) -> str:
    t = data["totals"]
    w = max([40] + [len(r["module"]) for r in data["layers"]])    # module paths are printed whole
    lines = [f"colauto cost model  (codegen {data.get('codegen') or '?'}, device preset {data['device']}, "
             f"optimizer {data['optimizer']}, "
             f"sizes {data['sizes'] or 'static'}, built in {data['cost_model_s'] * 1e3:.0f} ms)",
             f"{'module':<{w}} {'FLOPs':>12} {'activations':>12} {'est. time':>11}"]
    for r in data["layers"]:
        unknown = f"  ({r['unknown_ops']} ops of unknown cost)" if r["unknown_ops"] else ""
        lines.append(f"{r['module']:<{w}} {fmt_flops(r['flops']):>12} "
                     f"{fmt_bytes(r['activation_bytes']):>12} {r['est_time_s'] * 1e3:>9.3f}ms{unknown}")
    lines += [
        f"{'total':<{w}} {fmt_flops(t['flops_fwd'] + t['flops_bwd']):>12} "
        f"{fmt_bytes(t['saved_activation_bytes']):>12} {t['est_step_time_s'] * 1e3:>9.3f}ms",
        f"FLOPs fwd {fmt_flops(t['flops_fwd'])}, bwd {fmt_flops(t['flops_bwd'])}; "
        f"predicted peak {fmt_bytes(t['peak_memory_bytes'])} at {t['peak_at']} = parameters "
        f"{fmt_bytes(t['param_bytes'])} + gradients {fmt_bytes(t['grad_bytes'])} + optimizer state "
        f"{fmt_bytes(t['optimizer_state_bytes'])} + activations and temporaries",
    ]
    lines += _plan_lines(data.get("plan"))
    unknown = t["unknown_cost_ops"]
    lines.append("ops of unknown cost (timed by bytes only): " +
                 (", ".join(f"{op} x{n}" for op, n in sorted(unknown.items())) if unknown else "none"))
    return "\n".join(lines)


def emit(analysis: "Analysis", setting: str | None) -> None:
    """Print (setting "1") or write JSON (setting = path) on rank 0; nothing when off."""
    if setting is None or _rank() != 0:
        return
    data = summary(analysis)
    if setting == "1":
        print(render(data), flush=True)
    else:
        with open(setting, "w") as f:
            json.dump(data, f, indent=1, default=str)


def _plan_lines(plan: dict | None) -> list[str]:
    if plan is None:
        return []
    budget = "none" if plan["budget_bytes"] is None else fmt_bytes(plan["budget_bytes"])
    lines = [f"memory budget {budget}: predicted peak {fmt_bytes(plan['peak_without_bytes'])} without a plan, "
             f"{fmt_bytes(plan['peak_with_bytes'])} with it; saved for backward "
             f"{fmt_bytes(plan['saved_without_bytes'])} -> {fmt_bytes(plan['saved_with_bytes'])}"]
    if plan["recomputed"]:
        added = plan["step_time_with_s"] / plan["step_time_without_s"] - 1 if plan["step_time_without_s"] else 0.0
        lines.append(f"recompute adds {plan['recompute_time_s'] * 1e3:.3f} ms ({added:+.1%} est. step time); "
                     f"{plan['frontier_points']} Pareto plans, {plan['simulated_plans']} simulated, "
                     f"solved in {plan['solve_s'] * 1e3:.0f} ms")
        for layer, ops in plan["recomputed"].items():
            counts: dict[str, int] = {}
            for op in ops:
                counts[op] = counts.get(op, 0) + 1
            lines.append(f"  recomputed in {layer}: " + ", ".join(f"{op} x{n}" if n > 1 else op for op, n in counts.items()))
    else:
        lines.append("nothing recomputed: the step fits the budget as it is")
    return lines


def render_parallel(plan: dict) -> str:
    """The parallel plan: chosen mesh, its prediction, and every candidate mesh's."""
    p = plan["predicted"]
    budget = "none" if p["budget_bytes"] is None else fmt_bytes(p["budget_bytes"])
    lines = [f"colauto parallel plan  mesh {plan['mesh']}  (digest {plan['digest']}, link {p['link']}, "
             f"solved in {p['solve_s'] * 1e3:.0f} ms)",
             f"predicted per device: step {p['step_time_s'] * 1e3:.3f} ms = compute {p['compute_s'] * 1e3:.3f} + "
             f"communication {p['comm_s'] * 1e3:.3f} + recompute {p['recompute_s'] * 1e3:.3f} + optimizer "
             f"{p['optimizer_s'] * 1e3:.3f}; peak {fmt_bytes(p['memory_bytes'])} of budget {budget} "
             f"(model state {fmt_bytes(p['state_bytes'])})",
             "sequential choice (shard, then rematerialize): " + (
                 "does not fit" if p["sequential_mesh"] is None else
                 f"{p['sequential_mesh']}, {p['sequential_step_time_s'] * 1e3:.3f} ms"),
             f"{'candidate mesh':<24} {'step':>11} {'comm':>11} {'recompute':>11} {'peak':>12}"]
    for c in p["candidates"]:
        lines.append(f"{c['mesh']:<24} {c['step_time_s'] * 1e3:>9.3f}ms {c['comm_s'] * 1e3:>9.3f}ms "
                     f"{c['recompute_s'] * 1e3:>9.3f}ms {fmt_bytes(c['memory_bytes']):>12}"
                     + ("" if c["fits"] else "  (does not fit)"))
    if p.get("replicated_layers"):
        lines.append(f"replicated on the fsdp axis (the rest sharded): {', '.join(p['replicated_layers'])}")
    tp = plan.get("tp_modules") or {}
    if tp:
        lines.append(f"tensor parallel: {sum(r == 'col' for r in tp.values())} column and "
                     f"{sum(r == 'row' for r in tp.values())} row modules")
    if p.get("tp_off_layers"):
        lines.append(f"not tensor-parallel (replicated over tp): {', '.join(p['tp_off_layers'])}")
    if p.get("whole_batch_layers"):
        lines.append(f"computed on the tp group's whole batch: {', '.join(p['whole_batch_layers'])}")
    return "\n".join(lines)


def emit_parallel(plan: dict, setting: str | None) -> None:
    """COLAUTO_REPORT for the parallel plan: printed on rank 0, or JSON next to the cost-model report."""
    _emit_beside(setting, lambda: render_parallel(plan), ".parallel.json", "w",
                 lambda: json.dumps(plan, indent=1, default=str))


def render_fusion(data: dict) -> str:
    if data["unavailable"]:
        return f"colauto triton fusion ({data['graph']}): none, {data['unavailable']}"
    return (f"colauto triton fusion ({data['graph']}): {data['regions']} regions, {data['ops']} aten ops in "
            f"{len(set(data['kernels']))} kernels, predicted {fmt_bytes(data['bytes_saved'])} of intermediates "
            "not written to memory" + (f"; {data['rotations']} RoPE half-rotation cats made pointwise"
                                       if data.get("rotations") else ""))


def emit_fusion(data: dict, setting: str | None) -> None:
    """COLAUTO_REPORT for COLAUTO_CODEGEN=triton, one line per compiled graph (JSON: appended lines)."""
    _emit_beside(setting, lambda: render_fusion(data), ".fusion.jsonl", "a", lambda: json.dumps(data) + "\n")


def render_cuda_graphs(data: dict) -> str:
    state = "recorded after a warm-up call" if data["skipped"] is None else f"not recorded: {data['skipped']}"
    return f"colauto cuda graphs ({data['graph']}): {state}"


def emit_cuda_graphs(data: dict, setting: str | None) -> None:
    """COLAUTO_REPORT for COLAUTO_CUDAGRAPHS=1, one line per compiled graph (JSON: appended lines)."""
    _emit_beside(setting, lambda: render_cuda_graphs(data), ".cuda_graphs.jsonl", "a", lambda: json.dumps(data) + "\n")


def _emit_beside(setting: str | None, text, suffix: str, mode: str, body) -> None:
    """On rank 0: print `text()` (setting "1"), or write `body()` to a file next to the JSON report."""
    if setting is None or _rank() != 0:
        return
    if setting == "1":
        print(text(), flush=True)
    else:
        with open(setting.removesuffix(".json") + suffix, mode) as f:
            f.write(body())
