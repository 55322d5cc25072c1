"""Choose the plan: each candidate mesh costed with the rematerialization it would need.

Every candidate (a mesh shape with a role per axis) gets a per-device prediction from the rank's
single-device analysis (the cost model at the rank's micro-batch):
- compute: matmul time unchanged (tp multiplies the batch by tp and divides the work by tp); other ops
  scale like their activations.
- activations: unchanged, except those gathered over tp (column inputs; feature shards a mixing op
  reads), held tp-fold (`TPLayout.gathered_fraction`).
- model state: exact local shard sizes of parameters, gradients and optimizer state, plus the
  gathered copies of fsdp-sharded parameters (forward collectives are saved for backward).
- communication: the alpha-beta model (comm.py) per parameter and per tp activation crossing.
  Gradient reductions (all-reduce over dp, reduce-scatter over fsdp) are issued as gradients appear
  and waited for at the end of backward, so they hide behind backward compute up to its length;
  fsdp gathers and tp activation collectives sit on the critical path.
- rematerialization: if the prediction is over the budget, the cheapest point of the remat DP's
  Pareto frontier that frees enough activation memory; its recompute time is added. None frees
  enough: the candidate does not fit.
The joint choice is the fastest candidate that fits with its rematerialization. For comparison the
sequential choice (shard first, then rematerialize, as Colossal-Auto does) is the candidate fastest
without recomputation among those that fit without it (all, if none does), then rematerialized; the
joint one is never slower, and is faster where the sharding that is fastest before recomputation is
not the fastest after it.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

import numpy as np
import torch

from .. import planner
from ..analysis import Analysis
from ..report import fmt_bytes
from . import layers
from .comm import Link
from .mesh import Axes
from .plan import ParallelPlan
from .strategy import TPLayout, nbytes, plan_for


@dataclasses.dataclass(frozen=True)
class Single:
    """The numbers of the rank's single-device step that the candidates scale."""
    compute_s: float             # forward + backward
    matmul_share: float          # of compute_s
    backward_share: float        # of compute_s
    optimizer_s: float
    param_bytes: int
    optimizer_ratio: float       # optimizer state bytes per parameter byte
    transient_bytes: int         # peak less parameters, gradients and optimizer state
    freed: np.ndarray            # activation bytes each frontier point frees, ascending
    recompute_s: np.ndarray      # its recompute seconds

    def scaled(self, seconds: float, s_act: float) -> float:
        """Seconds of single-device work on a device whose activations are `s_act` times as large:
        matmul time unchanged, the rest scaled like the activations."""
        return seconds * (self.matmul_share + (1 - self.matmul_share) * s_act)

    @classmethod
    def of(cls, analysis: Analysis) -> "Single":
        ev = analysis.evaluate(analysis.hints)
        times = ev["_node_times"]
        matmul = np.array([c.kind == "matmul" for c in analysis.costs.nodes], dtype=bool)
        compute = float(times.sum())
        persistent = ev["param_bytes"] + ev["grad_bytes"] + ev["optimizer_state_bytes"]
        frontier, _, quantum = planner.remat_frontier(analysis.joint, analysis, ev)
        kept = frontier.memory * quantum
        order = np.argsort(kept[-1] - kept)
        return cls(compute, float(times[matmul].sum()) / compute if compute else 0.0,
                   float(times[~analysis._is_fwd].sum()) / compute if compute else 0.0, ev["est_optimizer_time_s"],
                   ev["param_bytes"], ev["optimizer_state_bytes"] / max(ev["param_bytes"], 1),
                   max(ev["peak_memory_bytes"] - persistent, ev["saved_activation_bytes"]),
                   (kept[-1] - kept)[order], frontier.time[order])


@dataclasses.dataclass(frozen=True)
class Estimate:
    axes: Axes
    compute_s: float
    comm_s: float
    recompute_s: float
    optimizer_s: float
    memory_bytes: int            # predicted per-device peak, rematerialization included
    state_bytes: int             # parameters + gradients + optimizer state + gathered parameters
    fits: bool
    fits_without_remat: bool

    @property
    def time_s(self) -> float:
        return self.compute_s + self.comm_s + self.recompute_s + self.optimizer_s


def act_scale(tp: TPLayout, n_tp: int) -> float:
    """Activation bytes per device over the single-device graph's: with sequence parallelism only the
    tensors gathered over tp (column inputs, mixed feature shards) are held tp-fold."""
    return 1.0 + tp.gathered_fraction * (n_tp - 1)


def param_cost(plan: ParallelPlan, fqn: str, p: torch.Tensor, link: Link) -> tuple[float, float, float, float]:
    """(bytes stored, bytes used in compute, gather seconds, gradient-reduction seconds) of one parameter
    on the rank holding the largest shard (torch.chunk's first)."""
    origin = (0,) * len(plan.axes)
    elem = p.element_size()
    here = math.prod(plan.local_shape(fqn, tuple(p.shape), origin)) * elem
    whole = math.prod(plan.local_shape(fqn, tuple(p.shape), origin, compute=True)) * elem
    fsdp = next((n for (r, n), pl in zip(plan.axes, plan.storage[fqn]) if r == "fsdp"), 1)
    sharded = any(r == "fsdp" and pl != "R" for (r, _), pl in zip(plan.axes, plan.storage[fqn]))
    dp = dict(plan.axes).get("dp", 1)
    if sharded:   # gathered for use; gradient reduce-scattered over fsdp, then all-reduced over dp
        return here, whole, link.all_gather(whole, fsdp), link.reduce_scatter(whole, fsdp) + link.all_reduce(
            whole / fsdp, dp)
    return here, whole, 0.0, link.all_reduce(whole, fsdp * dp)   # replicated on every data axis


def estimate(plan: ParallelPlan, params: dict[str, torch.Tensor], tp: TPLayout, single: Single,
             link: Link, budget: int | None) -> Estimate:
    n_tp = dict(plan.axes).get("tp", 1)
    s_act = act_scale(tp, n_tp)
    compute = single.scaled(single.compute_s, s_act)
    stored = used = gather = reduce = 0.0
    for fqn, p in params.items():
        c = param_cost(plan, fqn, p, link)
        stored, used, gather, reduce = stored + c[0], used + c[1], gather + c[2], reduce + c[3]
    activations = 0.0
    if n_tp > 1:   # gather + reduce-scatter (forward, and the reverse in backward) = one all-reduce each
        activations += sum(link.all_reduce(nbytes(n) * n_tp, n_tp) for n in tp.row_outputs + tp.col_inputs)
        activations += sum(link.all_gather(nbytes(n) * n_tp, n_tp) for n in tp.gathered)
    comm = gather + activations + max(0.0, reduce - compute * single.backward_share)
    state = int(stored * (2 + single.optimizer_ratio) + (used - stored))
    memory = memory_before = state + int(single.transient_bytes * s_act)
    limit = math.inf if budget is None else budget * (1 - planner.HEADROOM)
    recompute, fits = 0.0, memory <= limit
    if not fits:
        (recompute, freed), fits = _remat(single, s_act, memory - limit)
        memory = int(memory - freed)
    optimizer = single.optimizer_s * stored / max(single.param_bytes, 1)
    return Estimate(plan.axes, compute, comm, recompute, optimizer, memory, state, fits, fits and memory_before <= limit)


def _remat(single: Single, s_act: float, excess: float) -> tuple[tuple[float, float], bool]:
    """((recompute seconds, bytes freed), enough?) of the cheapest frontier point that frees `excess`
    bytes; if none does, the point that frees most."""
    enough = np.nonzero(single.freed * s_act >= excess)[0]
    k = int(enough[np.argmin(single.recompute_s[enough])]) if len(enough) else len(single.freed) - 1
    return (single.scaled(float(single.recompute_s[k]), s_act), float(single.freed[k]) * s_act), len(enough) > 0


def mixed(plan: ParallelPlan, params: dict[str, torch.Tensor], tp: TPLayout, single: Single, link: Link,
          budget: int | None) -> tuple[ParallelPlan, list[str]]:
    """Layer by layer, shard on the fsdp axis or replicate (layers.py). Costed as `estimate` costs, except
    that gradient reductions count as all hidden (if every layer replicated would still hide behind
    backward) or all exposed: additive per layer, as the DP needs. `estimate` then ranks the result."""
    if "fsdp" not in dict(plan.axes):
        return plan, []
    s_act = act_scale(tp, dict(plan.axes).get("tp", 1))
    backward = single.scaled(single.compute_s, s_act) * single.backward_share
    everything = layers.replicate(plan, list(params))
    hidden = sum(param_cost(everything, f, p, link)[3] for f, p in params.items()) <= backward

    def option(pl: ParallelPlan, fqns: list[str]) -> layers.Option:
        c = np.sum([param_cost(pl, f, params[f], link) for f in fqns], axis=0)
        return layers.Option(c[0] * (2 + single.optimizer_ratio) + c[1] - c[0], c[2] + (0.0 if hidden else c[3]))
    unsharded = [f for f, spec in plan.storage.items() if "S" not in "".join(spec)]
    fixed = single.transient_bytes * s_act + (option(plan, unsharded).state_bytes if unsharded else 0.0)
    limit = math.inf if budget is None else budget * (1 - planner.HEADROOM)

    def remat(excess: float) -> float | None:
        if excess <= 0:
            return 0.0
        (seconds, _), enough = _remat(single, s_act, excess)
        return seconds if enough else None
    return layers.mix(plan, option, fixed, limit, remat)


def choose(candidates: list[Axes], params: dict[str, torch.Tensor], tp_layout: Callable[[int], TPLayout],
           analysis: Analysis, link: Link, budget: int | None) -> ParallelPlan:
    """The joint choice, its prediction and every candidate's in `plan.predicted`. `tp_layout(size)`
    is the graph's tensor-parallel layout for a tp axis of that size."""
    start = time.perf_counter()
    single = Single.of(analysis)
    layouts = {n: tp_layout(n) for n in {dict(axes).get("tp", 1) for axes in candidates}}
    usable = [axes for axes in candidates if not layouts[dict(axes).get("tp", 1)].indivisible]
    if not usable:
        size = dict(candidates[0]).get("tp", 1)
        raise ValueError(f"colauto: tp={size} cannot split {layouts[size].indivisible[0]}: set COLAUTO_MESH "
                         "to a tp size that divides every head count, or another role for that axis")
    candidates = usable
    layout = lambda axes: layouts[dict(axes).get("tp", 1)]  # noqa: E731
    uniform = [plan_for(axes, params, layout(axes)) for axes in candidates]
    uniform_estimates = [estimate(p, params, layout(p.axes), single, link, budget) for p in uniform]
    sequential = _sequential(uniform_estimates)
    plans, replicated = zip(*(mixed(p, params, layout(p.axes), single, link, budget) for p in uniform))
    estimates = [e if p is u else estimate(p, params, layout(p.axes), single, link, budget)   # unchanged: reuse
                 for p, u, e in zip(plans, uniform, uniform_estimates)]
    fitting = [i for i, e in enumerate(estimates) if e.fits]
    if not fitting:
        least = min(estimates, key=lambda e: e.memory_bytes)
        raise planner.BudgetError(
            f"COLAUTO_MEMORY_BUDGET: no mesh fits {fmt_bytes(budget)} per device; the smallest prediction is "
            f"{fmt_bytes(least.memory_bytes)} ({_mesh(least.axes)}): raise the budget, use more devices or "
            "shrink the batch", int(least.memory_bytes / (1 - planner.HEADROOM)) + 1)
    # On a tie (to the microsecond) the mesh with fewer axes wins: a dp=2,fsdp=2 that replicates every
    # layer is dp=4, but reduces its gradients in two collectives, one per axis.
    joint = min(fitting, key=lambda i: (round(estimates[i].time_s, 6), len(estimates[i].axes)))
    chosen = estimates[joint]
    predicted = {
        "step_time_s": chosen.time_s, "compute_s": chosen.compute_s, "comm_s": chosen.comm_s,
        "recompute_s": chosen.recompute_s, "optimizer_s": chosen.optimizer_s,
        "memory_bytes": chosen.memory_bytes, "state_bytes": chosen.state_bytes, "budget_bytes": budget,
        "link": link.name,
        "sequential_mesh": None if sequential is None else _mesh(sequential.axes),
        "sequential_step_time_s": None if sequential is None else sequential.time_s,
        "replicated_layers": replicated[joint],
        "candidates": [dict(mesh=_mesh(e.axes), step_time_s=e.time_s, comm_s=e.comm_s, recompute_s=e.recompute_s,
                            memory_bytes=e.memory_bytes, fits=e.fits, replicated_layers=len(r))
                       for e, r in zip(estimates, replicated)],
        "solve_s": time.perf_counter() - start,
    }
    return dataclasses.replace(plans[joint], predicted=predicted)


def _sequential(estimates: list[Estimate]) -> Estimate | None:
    """Shard first, then rematerialize: the uniform candidate fastest without recomputation among
    those whose memory fits without it (all of them, if none does), then rematerialized; None if it
    cannot fit."""
    pool = [e for e in estimates if e.fits_without_remat] or estimates
    best = min(pool, key=lambda e: e.time_s - e.recompute_s)
    return best if best.fits else None


def _mesh(axes: Axes) -> str:
    return ",".join(f"{r}={s}" for r, s in axes)
