"""Choose what to recompute so the whole step fits the memory budget at the least added time.

1. The DP (solver/remat.py) gives the exact Pareto frontier of (bytes kept for backward, recompute
   time) over the forward DAG (graph.py).
2. Walking a fixed set of frontier points (all, or MAX_CANDIDATES spread evenly) from the fastest
   plan to the slowest, the first plan whose *simulated* step peak (cost/memory.py, on the partition
   the tags really produce) fits the budget is taken. A plan is simulated only if a lower bound of
   its peak (bytes held all step + bytes it keeps for backward) fits.
This rule is monotone by construction: the set of acceptable plans only shrinks as the budget
shrinks, so a smaller budget never gets a faster plan, nor one with a larger predicted peak.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import torch.fx as fx

from . import graph
from .analysis import Analysis, layer_of
from .emit import remat as emit
from .report import fmt_bytes
from .solver import remat as solver


# Frontier points whose peak may be simulated (each costs one partition + memory simulation).
MAX_CANDIDATES = 16


class BudgetError(RuntimeError):
    """No plan fits COLAUTO_MEMORY_BUDGET; `smallest_bytes` is the least peak found."""

    def __init__(self, message: str, smallest_bytes: int) -> None:
        super().__init__(message)
        self.smallest_bytes = smallest_bytes


@dataclasses.dataclass
class Plan:
    """A rematerialization plan (JSON-serializable through `to_dict`)."""
    budget_bytes: int | None
    peak_without_bytes: int
    peak_with_bytes: int
    saved_without_bytes: int
    saved_with_bytes: int
    recompute_time_s: float
    step_time_without_s: float
    step_time_with_s: float
    recomputed: dict[str, list[str]]      # layer -> forward ops the backward runs again
    frontier_points: int = 0
    simulated_plans: int = 0
    quantum_bytes: float = 0.0
    solve_s: float = 0.0                  # problem construction + DP
    plan_s: float = 0.0                   # everything, simulations of candidate plans included

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def resolve_budget(setting: tuple[str, float] | None, device_bytes: int) -> int | None:
    """Config's parsed COLAUTO_MEMORY_BUDGET -> bytes (None: no budget). Default: the device's memory."""
    if setting is None:
        return device_bytes
    kind, value = setting
    return None if kind == "none" else int(value * device_bytes) if kind == "fraction" else int(value)


def plan(joint: fx.GraphModule, partition: Callable, baseline: Analysis, budget: int | None,
         analysis_for: Callable[[fx.GraphModule, fx.GraphModule], Analysis],
         buffers: frozenset[str] = frozenset()) -> tuple[Plan, tuple, Analysis]:
    """(plan, (fw, bw), analysis of the chosen partition). `partition()` partitions `joint` as tagged;
    `buffers` are the placeholders of non-trainable module state (see graph.remat_problem)."""
    start = time.perf_counter()
    base = baseline.evaluate(baseline.hints)
    # Under aten codegen the unplanned partition is the fastest plan; under Inductor it is not (keeping
    # a fusible intermediate costs a write and a read), so the DP runs whenever the codegen fuses.
    if not baseline.fused and (budget is None or base["peak_memory_bytes"] <= budget):
        return _describe(budget, base, base, baseline, 0, 0, 0.0, 0.0, start), None, baseline
    times = graph.node_times(baseline.costs, base["_recompute_times"])
    keep_time: dict[str, float] = {}
    if baseline.fused:   # under Inductor, keeping a fusible intermediate costs writing it in forward
        bw = baseline.device.bandwidth   # and reading it back in backward
        keep_time = {c.name: 2 * graph.value_at(c.written, baseline.hints) / bw
                     for c in baseline.costs.nodes if c.kind == "memory"}
    # Op by op (aten), a tensor the backward first reads at or before the step's peak is live at the
    # peak whether it is kept or recomputed: recomputing it costs time and saves nothing, so it is
    # pinned. Under Inductor a recomputed memory-bound op fuses into its reader and never exists.
    phase, _, at = base["peak_at"].partition(":")
    pinned = (graph.read_by_backward_before(joint.graph, at) if phase == "bwd" and not baseline.fused
              else frozenset())
    problem, nodes, quantum = graph.remat_problem(joint.graph, times, baseline.hints, pinned=pinned,
                                                  buffers=buffers, keep_time=keep_time)
    frontier = solver.solve(problem)
    solve_s = time.perf_counter() - start
    # Lower bound of any plan's peak: what is held all step plus what the plan keeps for backward.
    held = base["param_bytes"] + base["optimizer_state_bytes"] + base["input_bytes"]
    candidates = _candidates(len(frontier.memory))
    simulated: dict[int, dict] = {}

    def simulate(k: int):
        emit.tag(nodes, frontier.keep(k))
        fw, bw = partition()
        emit.untag(nodes)
        analysis = analysis_for(fw, bw)
        simulated[k] = analysis.evaluate(analysis.hints)
        return (fw, bw), analysis

    limit = float("inf") if budget is None else budget
    for k in candidates:                                          # fastest plan first
        if held + frontier.memory[k] * quantum - len(nodes) * quantum > limit:   # cannot fit
            continue
        graphs, analysis = simulate(k)
        if simulated[k]["peak_memory_bytes"] <= limit:
            p = _describe(budget, base, simulated[k], analysis, len(frontier.memory), len(simulated),
                          quantum, solve_s, start)
            return p, graphs, analysis
    for k in candidates:        # nothing fits: find the least peak among the candidates to tell the user
        if k not in simulated:
            simulate(k)
    least = min(simulated.values(), key=lambda ev: ev["peak_memory_bytes"])
    persistent = least["param_bytes"] + least["grad_bytes"] + least["optimizer_state_bytes"]
    raise BudgetError(
        f"COLAUTO_MEMORY_BUDGET: {fmt_bytes(budget)} is below the smallest peak colauto found, "
        f"{fmt_bytes(least['peak_memory_bytes'])} (parameters + gradients + optimizer state "
        f"{fmt_bytes(persistent)}, activations and temporaries "
        f"{fmt_bytes(least['peak_memory_bytes'] - persistent)}); set it to at least that, or shrink the batch",
        least["peak_memory_bytes"])


def _candidates(n_points: int, most: int = MAX_CANDIDATES) -> list[int]:
    """Frontier points considered, fastest first: all, or `most` spread evenly. The set does not depend
    on the budget, which is what makes the choice monotone in the budget."""
    if n_points <= most:
        return list(range(n_points - 1, -1, -1))
    picks = {round(i * (n_points - 1) / (most - 1)) for i in range(most)}
    return sorted(picks, reverse=True)


def _describe(budget, base: dict, ev: dict, analysis: Analysis, points: int, simulated: int,
              quantum: float, solve_s: float, start: float) -> Plan:
    by_layer: dict[str, list[str]] = {}
    for c in analysis.costs.nodes:
        if c.name in analysis.recomputed and c.kind != "view":
            by_layer.setdefault(layer_of(c.module), []).append(c.op.replace("aten.", "").split(".")[0])
    return Plan(budget_bytes=budget, peak_without_bytes=base["peak_memory_bytes"],
                peak_with_bytes=ev["peak_memory_bytes"], saved_without_bytes=base["saved_activation_bytes"],
                saved_with_bytes=ev["saved_activation_bytes"], recompute_time_s=ev["est_recompute_time_s"],
                step_time_without_s=base["est_step_time_s"], step_time_with_s=ev["est_step_time_s"],
                recomputed=by_layer, frontier_points=points, simulated_plans=simulated,
                quantum_bytes=quantum, solve_s=solve_s, plan_s=time.perf_counter() - start)


def recomputed_in(bw: fx.GraphModule, joint: fx.GraphModule) -> frozenset[str]:
    """Forward nodes that the backward graph runs again (same names as in the joint graph)."""
    forward = {n.name for n in joint.graph.nodes if n.op == "call_function" and not graph.is_backward(n)}
    return frozenset(n.name for n in bw.graph.nodes if n.op == "call_function" and n.name in forward)

