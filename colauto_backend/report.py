"""COLAUTO_REPORT output: a per-layer table and totals (printed on rank 0), or the same as JSON."""
from __future__ import annotations

import json
import math
import re
import warnings
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

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


def natural_key(name: str) -> tuple:
    """Sort key putting numbered names in numeric order: blocks.2 before blocks.10."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name))


def fold_ranges(names: list[str]) -> list[str]:
    """Consecutive names that differ only in one number fold to a range, in the order given:
    model.layers.0 ... model.layers.31 -> model.layers.0-31."""
    out: list[tuple[str, int, int, str]] = []     # (prefix, first, last, suffix)
    for name in names:
        m = re.fullmatch(r"(.*?)(\d+)(\D*)", name)
        if m is None:
            out.append((name, -1, -1, ""))
            continue
        prefix, n, suffix = m.group(1), int(m.group(2)), m.group(3)
        if out and out[-1][0] == prefix and out[-1][3] == suffix and out[-1][2] == n - 1 and out[-1][1] >= 0:
            out[-1] = (prefix, out[-1][1], n, suffix)
        else:
            out.append((prefix, n, n, suffix))
    return [p if a < 0 else f"{p}{a}{suffix}" if a == b else f"{p}{a}-{b}{suffix}" for p, a, b, suffix in out]


def fmt_bytes(n: float, up: bool = False) -> str:
    """Bytes in the largest binary unit under 1024 of it, 2 decimals; `up`: rounded up in the last digit."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{math.ceil(n) if up else n:.0f} {unit}"
            return f"{math.ceil(n * 100) / 100 if up else n:.2f} {unit}"
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
            "cost_model_s": analysis.cost_s, "comm_ops": analysis.costs.comm_ops(),
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
        f"{fmt_bytes(t['optimizer_state_bytes'])} + activations and temporaries "
        f"{fmt_bytes(t['peak_memory_bytes'] - t['param_bytes'] - t['grad_bytes'] - t['optimizer_state_bytes'])}",
    ]
    lines += _plan_lines(data.get("plan"))
    comm = data.get("comm_ops") or {}
    if comm:
        lines.append("communication (collectives in this graph, timed by their bytes here; the parallel plan costs "
                     "them on the interconnect): " + ", ".join(f"{op} x{n}" for op, n in sorted(comm.items())))
    unknown = t["unknown_cost_ops"]
    lines.append("ops of unknown cost (timed by bytes only): " +
                 (", ".join(f"{op} x{n}" for op, n in sorted(unknown.items())) if unknown else "none"))
    return "\n".join(lines)


# The cost-model tables printed (emit, Profile.report), per model: a model's first parameter stands for it
# (Dynamo passes parameters to the backend), so the same graph of the same model prints once, and another
# model (a test's, a second script's) prints its own. Graphs with no parameter share one set.
_SHOWN: "WeakIdKeyDictionary" = WeakIdKeyDictionary()
_NO_OWNER: set[str] = set()


def _shown_for(owner: Any) -> set[str]:
    if owner is None:
        return _NO_OWNER
    return _SHOWN.setdefault(owner, set())


def _table_key(data: dict) -> str:
    """The table of `data` whatever the time its cost model took, and whether its sizes were symbols
    (profile()'s capture) or fixed (the compile's, at the same sizes): equal for the same numbers."""
    return render(dict(data, cost_model_s=0.0, sizes={}))


def shown(data: dict, owner: Any = None) -> str:
    """The table of `data`, recorded as printed for `owner` (a model's first parameter), so a later
    emission of the same one for the same model says so in a line instead."""
    _shown_for(owner).add(_table_key(data))
    return render(data)


_BREAKS_SEEN: set[str] = set()


def graph_breaks() -> list[str]:
    """Dynamo's graph-break reasons recorded in this process (first line of each, once), in order. A break
    taken where Dynamo compiles the partial graph at once (data-dependent branching: `generic_jump`) is in
    its "unimplemented" counts only, not "graph_break", when that graph is compiled, which was then planned
    as the step's only graph (HF OPT under transformers 5.17 on an H100, presumably so: 23.48 GiB under a
    19.1 GiB budget). Models Dynamo captures whole record neither (tiny HF Llama, T5, ViT, Qwen2-MoE, OPT, BERT)."""
    from torch._dynamo.utils import counters
    reasons: list[str] = []
    for kind in ("graph_break", "unimplemented"):
        for reason in counters.get(kind, {}):
            first = reason.strip().splitlines()[0]
            if first not in reasons:
                reasons.append(first)
    return reasons


_BUDGET_BREAKS_SEEN: set[str] = set()


def warn_unshared_budget(budgeted: bool) -> None:
    """Called at each compiled graph. Under a memory budget (`budgeted`) that the step's graphs do not share
    (on several ranks; in one process they do: split_step), a graph break Dynamo recorded since colauto's
    last compile (this step is being split) is a warning, report or not: each graph is planned under the
    whole budget, so the step's graphs together can peak above it (seen: HF OPT, 23.86 GiB under a 19.1 GiB
    budget). A break seen at an unbudgeted compile is not named at a later one."""
    new = [b for b in graph_breaks() if b not in _BUDGET_BREAKS_SEEN]
    _BUDGET_BREAKS_SEEN.update(new)
    if new and budgeted:
        warn_once(f"colauto: Dynamo split the step into several graphs at a graph break ({'; '.join(new)}): "
                  "each graph is planned under the whole memory budget, so the step's peak can exceed it; "
                  "remove the graph break (torch._dynamo.explain(model)(...) shows where) or lower the budget")


def emit(analysis: "Analysis", setting: str | None, owner: Any = None) -> None:
    """Print (setting "1") or write JSON (setting = path) on rank 0; nothing when off. A table this
    process already printed for this model (`owner`: its first parameter; the same graph compiled again,
    or shown by Profile.report) is one line.
    A graph break Dynamo recorded since the last table is named before it, with what it means here."""
    if setting is None or _rank() != 0:
        return
    data = summary(analysis)
    breaks = graph_breaks()
    data["graph_breaks"] = breaks
    new = [b for b in breaks if b not in _BREAKS_SEEN]
    _BREAKS_SEEN.update(new)
    if setting == "1" and new:
        print(f"colauto: Dynamo split the step into several graphs at a graph break ({'; '.join(new)}): each "
              "graph gets its own table and plan; under a memory budget you set, each is planned under what the "
              "graphs before it leave (one process)", flush=True)
    if setting == "1":
        if _table_key(data) in _shown_for(owner):
            print(f"colauto cost model: the same graph as the table above (codegen {data.get('codegen')})",
                  flush=True)
            return
        print(shown(data, owner), flush=True)
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
    if plan.get("chunked_losses"):
        lines.append("the loss's gradient is computed in the forward, in blocks of rows: no [tokens, vocabulary] "
                     "tensor is kept for the backward (COLAUTO_CHUNKED_LOSS=on; both peaks above count this)")
    if plan["recomputed"]:
        added = plan["step_time_with_s"] / plan["step_time_without_s"] - 1 if plan["step_time_without_s"] else 0.0
        if plan.get("modeled_plans"):
            checked = ("the chosen one's real partition checked" if plan.get("partition_checked", True)
                       else "not partitioned (explain: compile checks the chosen one's real partition)")
            miss = f", {plan['model_misses']} rejected by their real partition" if plan.get("model_misses") else ""
            run = plan.get("partitions_run", 0)
            ran = f"; {run} real partition{'s' if run != 1 else ''} run" if run else ""
            candidates = f"{plan['modeled_plans']} partitions modeled, {checked}{miss}{ran}"
        else:
            candidates = f"{plan['simulated_plans']} simulated"
        if plan.get("cache") == "hit":
            candidates = "plan cache hit: the stored plan partitioned, nothing solved"
        elif plan.get("cache"):
            candidates += f"; plan cache: {plan['cache']}"
        lines.append(f"recompute adds {plan['recompute_time_s'] * 1e3:.3f} ms ({added:+.1%} est. step time); "
                     f"{plan['frontier_points']} Pareto plans, {candidates}, "
                     f"DP solved in {plan['solve_s'] * 1e3:.0f} ms, planned in {plan['plan_s']:.1f} s "
                     "(partitions and models included)")
        if plan.get("dp_pruned_steps"):
            lines.append(f"  approximate: the DP held too many states at {plan['dp_pruned_steps']} steps and kept "
                         "the likeliest (counted: 'remat DP pruned'); a better plan may exist")
        for layer, ops in plan["recomputed"].items():
            counts: dict[str, int] = {}
            for op in ops:
                counts[op] = counts.get(op, 0) + 1
            lines.append(f"  recomputed in {layer}: " + ", ".join(f"{op} x{n}" if n > 1 else op for op, n in counts.items()))
    else:
        lines.append("nothing recomputed: the step fits the budget as it is")
    return lines


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms" if seconds >= 0.1 else f"{seconds * 1e3:.3f} ms"


def _noop_axes(mesh: str, effective: str) -> str:
    """Why a mesh is another in effect: the axes of it that only split the batch."""
    kept = dict(a.split("=") for a in effective.split(","))
    out = []
    for axis in mesh.split(","):
        role, size = axis.split("=")
        if role == "fsdp" and kept.get("fsdp") != size:
            out.append("the fsdp axis shards no parameter")
        if role == "tp" and kept.get("tp") != size:
            out.append("no layer runs tensor-parallel on the tp axis")
    return " and ".join(out) or "its axes only split the batch"


def _separates(c: dict, chosen: dict) -> str:
    """What makes candidate `c` worse than the chosen plan, in its largest terms."""
    if not c["fits"]:
        return f"does not fit ({fmt_bytes(c['memory_bytes'])})"
    d = c["step_time_s"] - chosen["step_time_s"]
    if abs(d) < 1e-6:
        return "same time" + (": same plan in effect" if c["effective_mesh"] == chosen["effective_mesh"]
                              else "; more axes in effect")
    parts = [(c.get(k, 0.0) - chosen.get(k, 0.0), name) for k, name in
             (("compute_s", "compute"), ("comm_s", "exposed comm"), ("recompute_s", "recompute"),
              ("optimizer_s", "optimizer"))]
    def signed(seconds: float) -> str:
        return f"{seconds * 1e3:+,.1f} ms" if abs(seconds) >= 1e-4 else f"{seconds * 1e3:+.3f} ms"
    parts = [f"{name} {signed(delta)}" for delta, name in sorted(parts, key=lambda x: -abs(x[0]))
             if abs(delta) >= 0.05 * abs(d) and abs(delta) >= 1e-6][:3]
    return f"{signed(d)} ({d / chosen['step_time_s']:+.2%})" + (": " + ", ".join(parts) if parts else "")


def _layer_text(row: dict, effective: str = "") -> str:
    parts = []
    if row.get("fsdp") and "fsdp=" in effective:
        parts.append(f"fsdp {row['fsdp']}")
    if row.get("tp") and "tp=" in effective:
        parts.append(f"tp {row['tp']}")
    return ", ".join(parts) or "replicated"


def layer_lines(rows: list[dict], effective: str = "fsdp=,tp=") -> list[str]:
    """Layers in model order, consecutive ones placed alike folded: model.layers.0-31: fsdp sharded."""
    runs: list[tuple[str, list[str]]] = []
    for row in rows:
        text = _layer_text(row, effective)
        if runs and runs[-1][0] == text:
            runs[-1][1].append(row["layer"])
        else:
            runs.append((text, [row["layer"]]))
    return [f"  {', '.join(fold_ranges(names))}: {text}" for text, names in runs]


def render_parallel(plan: dict, title: str | None = None) -> str:
    """The parallel plan as one table: the mesh chosen and why, the per-device step split into compute,
    exposed communication and recompute, peak memory against the budget, every other candidate mesh
    with what separates it from the choice, and each layer's placement (model order, ranges folded)."""
    p = plan["predicted"]
    budget = p["budget_bytes"]
    cands = p["candidates"]
    chosen = next((c for c in cands if c["mesh"] == plan["mesh"] and c["step_time_s"] == p["step_time_s"]),
                  None) or dict(mesh=plan["mesh"], effective_mesh=plan["mesh"], step_time_s=p["step_time_s"],
                                fits=True, memory_bytes=p["memory_bytes"])
    chosen.setdefault("effective_mesh", p.get("effective_mesh", plan["mesh"]))
    eff = p.get("effective_mesh", plan["mesh"])
    lines = [title] if title else []
    lines.append(f"colauto parallel plan  mesh {plan['mesh']}" +
                 (f" = {eff} in effect ({_noop_axes(plan['mesh'], eff)})" if eff != plan["mesh"] else "") +
                 f"  (digest {plan['digest']}, link {p['link']}, solved in {p['solve_s'] * 1e3:.0f} ms)")
    fitting = [c for c in cands if c["fits"]]
    step = p["step_time_s"]
    if len(cands) == 1:
        why = "the only mesh asked for (--mesh names every axis's role)"
    else:
        others = [c for c in fitting if c["effective_mesh"] != eff]
        why = f"the fastest of the {len(fitting)} of {len(cands)} candidate meshes that fit"
        same = [c["mesh"] for c in fitting if c["effective_mesh"] == eff and c["mesh"] != plan["mesh"]
                and abs(c["step_time_s"] - step) < 1e-6]
        if same:
            why += (f"; tied with {', '.join(same)}, the same plan in effect ({eff}): ties go to the fewest "
                    "axes in effect, then in the mesh, then the first listed")
        if others:
            nxt = min(others, key=lambda c: c["step_time_s"])
            why += f"; next best {nxt['mesh']}: {_separates(nxt, chosen)}"
    lines.append(f"why: {why}")
    if p.get("traced_layers"):
        lines.append("traced " + ", ".join(f"{k} of the {n} layers of {name}" for name, (k, n) in p["traced_layers"].items())
                     + ": the joint graph's other layers are copies of layer 1's (layers that can differ are traced whole)")
    hidden = max(0.0, p.get("comm_total_s", p["comm_s"]) - p["comm_s"])
    lines += [
        f"{'per-device step':<24}{_ms(step):>14}",
        f"{'  compute':<24}{_ms(p['compute_s']):>14}  {p['compute_s'] / step:6.1%}",
        f"{'  communication exposed':<24}{_ms(p['comm_s']):>14}  {p['comm_s'] / step:6.1%}   "
        f"(all collectives {_ms(p.get('comm_total_s', p['comm_s']))}; {_ms(hidden)} hidden behind backward)",
        f"{'  recompute':<24}{_ms(p['recompute_s']):>14}  {p['recompute_s'] / step:6.1%}",
        f"{'  optimizer':<24}{_ms(p['optimizer_s']):>14}  {p['optimizer_s'] / step:6.1%}",
        f"{'peak memory':<24}{fmt_bytes(p['memory_bytes']):>14}  " + (
            "no budget" if budget is None else
            f"{'fits' if p['memory_bytes'] <= budget else 'DOES NOT FIT'} the budget of {fmt_bytes(budget)} per device")
        + f"  (model state {fmt_bytes(p['state_bytes'])}: parameters, gradients, optimizer state, gathered "
          f"copies; activations and temporaries {fmt_bytes(p['memory_bytes'] - p['state_bytes'])})",
        "sequential choice (shard, then rematerialize): " + (
            "does not fit" if p["sequential_mesh"] is None else
            f"{p['sequential_mesh']}, {_ms(p['sequential_step_time_s'])}"),
    ]
    # candidates: identical predictions folded into one row; fitting ones by step time
    rows: dict[tuple, list[dict]] = {}
    for c in sorted(cands, key=lambda c: (not c["fits"], c["step_time_s"] if c["fits"] else c["memory_bytes"])):
        u = c.get("uniform") or {}
        key = (c["effective_mesh"], round(c["step_time_s"], 6), c["memory_bytes"], c["fits"],
               round(u.get("step_time_s", 0.0), 6), u.get("fits"))
        rows.setdefault(key, []).append(c)
    w = max([16] + [len(" ".join(c["mesh"] for c in g)) for g in rows.values() if g[0]["fits"]])
    w = min(w, 44)
    lines.append(f"{'candidate mesh':<{w}} {'in effect':<16} {'step':>12} {'comm exp.':>11} {'recompute':>11} "
                 f"{'peak':>11} {'all-alike step':>15}  vs chosen")
    unfit = []
    for group in rows.values():
        c = group[0]
        if not c["fits"]:
            unfit += group
            continue
        names = " ".join(x["mesh"] for x in group)
        u = c.get("uniform")
        alike = "-" if u is None else (_ms(u["step_time_s"]) if u["fits"] else "no fit")
        mark = "*" if any(x["mesh"] == plan["mesh"] for x in group) else " "
        lines.append(f"{names:<{w}} {c['effective_mesh']:<16} {_ms(c['step_time_s']):>12} {_ms(c['comm_s']):>11} "
                     f"{_ms(c['recompute_s']):>11} {fmt_bytes(c['memory_bytes']):>11} {alike:>15} {mark}"
                     + ("chosen" if mark == "*" else _separates(c, chosen)))
    if unfit:
        least = min(unfit, key=lambda c: c["memory_bytes"])
        lines.append(f"do not fit ({len(unfit)}; least peak {fmt_bytes(least['memory_bytes'])} on {least['mesh']}): "
                     + " ".join(c["mesh"] for c in unfit))
    lines.append("(all-alike: the same mesh with every layer placed the same way; the plan may mix per layer)")
    tp = plan.get("tp_modules") or {}
    if tp:
        lines.append(f"tensor parallel: {sum(r == 'col' for r in tp.values())} column and "
                     f"{sum(r == 'row' for r in tp.values())} row modules")
    if p.get("replicated_ops"):
        lines.append("run replicated over tp, their inputs gathered (DTensor has no sharding rule for them; "
                     "costed in communication): " + ", ".join(p["replicated_ops"]))
    if p.get("layers"):
        lines.append("layers (model order)")
        lines += layer_lines(p["layers"], eff)
    else:
        if p.get("replicated_layers"):
            lines.append("replicated on the fsdp axis (the rest sharded): " + ", ".join(fold_ranges(p["replicated_layers"])))
        if p.get("tp_off_layers"):
            lines.append("not tensor-parallel (replicated over tp): " + ", ".join(fold_ranges(p["tp_off_layers"])))
        if p.get("whole_batch_layers"):
            lines.append("computed on the tp group's whole batch: " + ", ".join(fold_ranges(p["whole_batch_layers"])))
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
                                       if data.get("rotations") else "")
            + (f"; the plan's {data['recomputed_left']} recomputed ops left out, each run where its reader is"
               if data.get("recomputed_left") else "")
            + ("; the rest runs as aten ops" if data.get("rest") != "inductor" else
               f"; the rest compiled by Inductor, whose wrapper launches "
               f"{data.get('wrapped', 0)} of the {data['regions']} calls"))


def emit_fusion(data: dict, setting: str | None) -> None:
    """COLAUTO_REPORT for COLAUTO_CODEGEN=triton, one line per compiled graph (JSON: appended lines)."""
    _emit_beside(setting, lambda: render_fusion(data), ".fusion.jsonl", "a", lambda: json.dumps(data) + "\n")


def render_collectives(data: dict) -> str:
    if data.get("kept_in_order"):
        return (f"colauto collectives ({data['graph']}): kept in their traced order, each waited where DTensor "
                "traced its wait (CPU tensors: gloo's worker threads corrupt the heap when two collectives of one group "
                "finish at once; see parallel/overlap.py)")
    return (f"colauto collectives ({data['graph']}): {data['waits_moved']} waits moved to the graph's end, so their "
            f"collectives overlap the compute after them; {data['all_reduces_bucketed']} all-reduces merged into "
            f"{data['buckets']} buckets; {data.get('gathers_prefetched', 0)} parameter all-gathers issued ahead of "
            "their use")


def emit_collectives(data: dict, setting: str | None) -> None:
    """COLAUTO_REPORT for a graph whose collective waits parallel.overlap moved, one line per graph."""
    _emit_beside(setting, lambda: render_collectives(data), ".collectives.jsonl", "a", lambda: json.dumps(data) + "\n")


def render_cuda_graphs(data: dict) -> str:
    state = "recorded after a warm-up call" if data["skipped"] is None else f"not recorded: {data['skipped']}"
    return f"colauto cuda graphs ({data['graph']}): {state}"


def emit_cuda_graphs(data: dict, setting: str | None) -> None:
    """COLAUTO_REPORT for COLAUTO_CUDAGRAPHS=1, one line per compiled graph (JSON: appended lines)."""
    _emit_beside(setting, lambda: render_cuda_graphs(data), ".cuda_graphs.jsonl", "a", lambda: json.dumps(data) + "\n")


def render_planned_rules(data: dict) -> str:
    rules = ",".join(data["rules"]) or "none"
    return (f"colauto: Inductor compiled the plan's backward ({data['recomputed']} recomputed ops) with "
            f"COLAUTO_PLANNED_RULES={rules}: {data['fusions_refused']} horizontal fusions of a recomputation refused"
            + ("" if "reuse" not in data["rules"] else "; freed buffers reused only by the next kernel")
            + (" (none are counted where Inductor's cache served the graph, compiled under the same rules)"
               if data["fusions_refused"] == 0 and "fusion" in data["rules"] else ""))


def emit_planned_rules(data: dict, setting: str | None) -> None:
    """COLAUTO_REPORT for a planned backward compiled by Inductor (`compat._as_planned`), one line per graph."""
    _emit_beside(setting, lambda: render_planned_rules(data), ".planned_rules.jsonl", "a",
                 lambda: json.dumps(data) + "\n")


def emit_cache_hit(setting: str | None) -> None:
    """COLAUTO_REPORT for a graph whose compiled step torch's AOTAutograd cache returned: nothing was
    traced or planned, so there is no table to print."""
    text = ("colauto: compiled step loaded from torch's compile cache (planned by an earlier launch under the "
            "same settings; COLAUTO_PLAN_CACHE=0 plans anew)")
    _emit_beside(setting, lambda: text, ".cache.jsonl", "a", lambda: json.dumps({"cache": "hit"}) + "\n")


def emit_unused_grads(shapes: tuple, setting: str | None) -> None:
    """COLAUTO_REPORT for a graph whose backward is compiled without the gradients of the outputs returned
    beside its loss (output_grads.py)."""
    listed = ", ".join(str(list(s)) for s in shapes)
    text = (f"colauto: outputs returned beside the loss get no gradient (autograd makes no zeros for them, the "
            f"backward reads none): {listed}; a gradient that reaches one raises; COLAUTO_OUTPUT_GRADS=all keeps them")
    _emit_beside(setting, lambda: text, ".output_grads.jsonl", "a",
                 lambda: json.dumps({"outputs_without_gradient": [list(s) for s in shapes]}) + "\n")


def _emit_beside(setting: str | None, text, suffix: str, mode: str, body) -> None:
    """On rank 0: print `text()` (setting "1"), or write `body()` to a file next to the JSON report."""
    if setting is None or _rank() != 0:
        return
    if setting == "1":
        print(text(), flush=True)
    else:
        with open(setting.removesuffix(".json") + suffix, mode) as f:
            f.write(body())


def render_compiled_peak(data: dict) -> str:
    budget = data.get("budget_bytes")
    over = budget is not None and data["compiled_bytes"] > budget
    dropped = data.get("dropped_bytes")
    return (f"colauto: peak of the compiled code {fmt_bytes(data['compiled_bytes'])} at {data['compiled_at']} "
            f"(memory model: {fmt_bytes(data['model_bytes'])}, {data['model_error_pct']:+.1f}%)"
            + ("" if dropped is None or dropped == data["compiled_bytes"] else
               f"; {fmt_bytes(dropped)} where the script keeps only the loss, not the model's outputs")
            + ("" if budget is None else f"; budget {fmt_bytes(budget)}")
            + ("" if not data.get("planned_under_bytes") else f" (planned under {fmt_bytes(data['planned_under_bytes'])})")
            + (" - OVER THE BUDGET: set COLAUTO_MEMORY_BUDGET lower by the difference" if over else ""))


def render_replanned(data: dict) -> str:
    if data.get("compiled_bytes") is None:   # Inductor took the backward from its cache: no code was read
        head = (f"colauto: the compiled code's peak could not be read (Inductor took the backward from its cache), "
                f"so it cannot be held to the budget {fmt_bytes(data['budget_bytes'])}: ")
    else:
        head = (f"colauto: the compiled code's peak {fmt_bytes(data['compiled_bytes'])} is over the budget "
                f"{fmt_bytes(data['budget_bytes'])} by {fmt_bytes(data['over_bytes'])}: ")
    if data.get("rules"):   # the same plan, compiled again under stricter rules (backend._held_to_budget)
        return (head + f"its backward compiled again with COLAUTO_PLANNED_RULES={','.join(data['rules'])} (Inductor's "
                "horizontal fusions of recomputed ops refused)")
    return (head + f"planned and compiled again under {fmt_bytes(data['planned_under_bytes'])}"
            + ("; later launches plan under it at once" if data.get("kept") else ""))


def emit_rules_kept(rules: list[str], setting: str | None) -> None:
    """COLAUTO_REPORT: the rules a step held to its budget needed, kept for later launches (plan_cache)."""
    _emit_beside(setting, lambda: f"colauto: later launches compile this step with COLAUTO_PLANNED_RULES={','.join(rules)} at once",
                 ".rules_kept.jsonl", "a", lambda: json.dumps({"rules": rules}) + "\n")


def emit_replanned(data: dict, setting: str | None) -> None:
    """A step whose compiled code's peak was over the budget (or, for a backward compiled again under the
    fusion rule, could not be read), planned or compiled again (backend._held_to_budget, backend's run):
    warned once whatever the setting (its compile took twice), and with COLAUTO_REPORT a line (JSON:
    appended lines)."""
    warn_once(render_replanned(data))
    _emit_beside(setting, lambda: render_replanned(data), ".replanned.jsonl", "a", lambda: json.dumps(data) + "\n")


def render_shared_budget(data: dict) -> str:
    held = data["saved_bytes"] + data["param_bytes"]
    room = data["budget_bytes"] - held > data["under_bytes"]
    return (f"colauto: this graph of a step Dynamo split at a graph break runs while {data['graphs']} earlier "
            f"graph(s) hold {fmt_bytes(held)} (saved for their backward {fmt_bytes(data['saved_bytes'])}, "
            f"parameters and optimizer state {fmt_bytes(data['param_bytes'])})"
            + (" and leaves room for the graphs after it" if room else "")
            + f": planned under {fmt_bytes(data['under_bytes'])} of the budget {fmt_bytes(data['budget_bytes'])}")


def emit_shared_budget(data: dict, setting: str | None) -> None:
    """A later graph of a split step planned under the budget less what the earlier graphs hold
    (backend._shared_budget, split_step): a COLAUTO_REPORT line (JSON: appended lines)."""
    _emit_beside(setting, lambda: render_shared_budget(data), ".shared_budget.jsonl", "a", lambda: json.dumps(data) + "\n")


def render_loosened(data: dict) -> str:
    if "least_model_bytes" in data:     # a budget under the model's least plan, that plan compiled
        model = "" if data["least_model_bytes"] is None else f" (memory model: {fmt_bytes(data['least_model_bytes'])})"
        code = ("could not be read" if data["compiled_bytes"] is None
                else f"peaks {fmt_bytes(data['compiled_bytes'])}")
        return (f"colauto: no plan the memory model makes fits the budget {fmt_bytes(data['budget_bytes'])}; its "
                f"least plan{model} compiled, and its code {code}: "
                + ("it runs" if data["runs"] else "the budget is refused"))
    if data.get("kept_bytes") is not None:
        over = ("could not be held to the budget" if data.get("looser_bytes") is None
                else f"peaked {fmt_bytes(data['looser_bytes'])}, over the budget")
        return (f"colauto: the looser plan's compiled step {over}: the plan that held it (peak "
                f"{fmt_bytes(data['kept_bytes'])}) runs, and later launches plan so at once")
    unused = (f"colauto: the compiled code's peak {fmt_bytes(data['compiled_bytes'])} leaves "
              f"{fmt_bytes(data['budget_bytes'] - data['compiled_bytes'])} of the budget {fmt_bytes(data['budget_bytes'])} "
              f"unused (the memory model put it at {fmt_bytes(data['model_bytes'])})")
    if data.get("gain") is not None:     # a looser plan the planner expects too little faster to compile
        return (f"{unused}; a plan recomputing less is expected only {100 * data['gain']:.1f}% faster, under the "
                f"{100 * data['least_gain']:.0f}% a second compile of the step is worth: not compiled, and later "
                "launches plan as this one")
    return f"{unused}: planned and compiled again under {fmt_bytes(data['planned_under_bytes'])}, recomputing less"


def emit_loosened(data: dict, setting: str | None) -> None:
    """A step whose compiled code peaked well under the budget, planned again under more of it, and, where
    that plan's step went over, the plan that held it kept (backend._held_to_budget). Not a warning (the
    budget holds either way): a COLAUTO_REPORT line (JSON: appended lines)."""
    _emit_beside(setting, lambda: render_loosened(data), ".loosened.jsonl", "a", lambda: json.dumps(data) + "\n")


def emit_compiled_peak(analysis: "Analysis", compiled: tuple[int, str], setting: str | None,
                       dropped: tuple[int, str] | None = None, held: int | None = None, again: bool = False) -> None:
    """Once Inductor compiled every graph of a training step: the step's peak with those graphs run as
    their generated code allocates (`Analysis.compiled_peak`; `dropped`: the same where the script keeps
    only the loss), beside the memory model's prediction the plan was chosen by, one line per graph
    (JSON: appended lines). A compiled peak over the budget is also warned about, whatever the setting:
    the one of a script that holds the outputs, as the plan assumes. The budget is the user's: `held`
    where the plan was made under less of it (`Config.held_budget`), else the plan's."""
    model = analysis.evaluate(analysis.hints)["peak_memory_bytes"]
    plan = analysis.plan
    planned = plan.budget_bytes if plan is not None and plan.budget_bytes else None
    budget = held if held is not None else planned
    data = {"compiled_bytes": compiled[0], "compiled_at": compiled[1], "model_bytes": model,
            "model_error_pct": 100 * (model / compiled[0] - 1) if compiled[0] else 0.0, "budget_bytes": budget,
            "planned_under_bytes": planned if planned != budget else None,
            "dropped_bytes": dropped[0] if dropped else None}
    if budget is not None and compiled[0] > budget and not again:   # again: the caller compiles once more
        warn_once(render_compiled_peak(data))
    _emit_beside(setting, lambda: render_compiled_peak(data), ".compiled_peak.jsonl", "a",
                 lambda: json.dumps(data) + "\n")
