"""Choose the plan: each candidate mesh costed with the rematerialization it would need.

Every candidate (a mesh shape with a role per axis) gets a per-device prediction from the rank's
single-device analysis (the cost model at the rank's micro-batch):
- compute: matmul time unchanged (tp multiplies the batch by tp and divides the work by tp); other ops
  scale like their activations.
- activations: a tp axis gathers the batch of its tp group, so an activation tp does not shard grows
  tp-fold (`TPLayout.sharded_fraction` is the share it does shard).
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


def estimate(plan: ParallelPlan, params: dict[str, torch.Tensor], tp: TPLayout, single: Single,
             link: Link, budget: int | None) -> Estimate:
    sizes = dict(plan.axes)
    n_tp = sizes.get("tp", 1)
    s_act = tp.sharded_fraction + (1 - tp.sharded_fraction) * n_tp
    compute = single.compute_s * (single.matmul_share + (1 - single.matmul_share) * s_act)
    origin = (0,) * len(plan.axes)               # the first shard is the largest (torch.chunk)
    stored = used = gather = reduce = 0.0
    for fqn, p in params.items():
        elem = p.element_size()
        here = math.prod(plan.local_shape(fqn, tuple(p.shape), origin)) * elem
        whole = math.prod(plan.local_shape(fqn, tuple(p.shape), origin, compute=True)) * elem
        stored, used = stored + here, used + whole
        fsdp = next((n for (r, n), pl in zip(plan.axes, plan.storage[fqn]) if r == "fsdp" and pl != "R"), 1)
        gather += link.all_gather(whole, fsdp)
        reduce += link.reduce_scatter(whole, fsdp) + link.all_reduce(whole / fsdp, sizes.get("dp", 1))
    activations = 0.0
    if n_tp > 1:
        activations += sum(2 * link.all_reduce(nbytes(n) * n_tp, n_tp) for n in tp.row_outputs)
        activations += sum(link.all_gather(nbytes(n) * n_tp, n_tp) for n in tp.gathered)
    comm = gather + activations + max(0.0, reduce - compute * single.backward_share)
    state = int(stored * (2 + single.optimizer_ratio) + (used - stored))
    memory = memory_before = state + int(single.transient_bytes * s_act)
    limit = math.inf if budget is None else budget * (1 - planner.HEADROOM)
    recompute, fits = 0.0, memory <= limit
    if not fits:   # the cheapest frontier point that frees enough; none: the one that frees most
        enough = np.nonzero(single.freed * s_act >= memory - limit)[0]
        k = int(enough[np.argmin(single.recompute_s[enough])]) if len(enough) else len(single.freed) - 1
        recompute = float(single.recompute_s[k]) * (single.matmul_share + (1 - single.matmul_share) * s_act)
        memory, fits = int(memory - single.freed[k] * s_act), len(enough) > 0
    optimizer = single.optimizer_s * stored / max(single.param_bytes, 1)
    return Estimate(plan.axes, compute, comm, recompute, optimizer, memory, state, fits, fits and memory_before <= limit)


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
    plans = [plan_for(axes, params, layouts[dict(axes).get("tp", 1)]) for axes in candidates]
    estimates = [estimate(p, params, layouts[dict(p.axes).get("tp", 1)], single, link, budget) for p in plans]
    fitting = [i for i, e in enumerate(estimates) if e.fits]
    if not fitting:
        least = min(estimates, key=lambda e: e.memory_bytes)
        raise planner.BudgetError(
            f"COLAUTO_MEMORY_BUDGET: no mesh fits {fmt_bytes(budget)} per device; the smallest prediction is "
            f"{fmt_bytes(least.memory_bytes)} ({_mesh(least.axes)}): raise the budget, use more devices or "
            "shrink the batch", int(least.memory_bytes / (1 - planner.HEADROOM)) + 1)
    joint = min(fitting, key=lambda i: estimates[i].time_s)
    sequential = _sequential(estimates)
    chosen = estimates[joint]
    predicted = {
        "step_time_s": chosen.time_s, "compute_s": chosen.compute_s, "comm_s": chosen.comm_s,
        "recompute_s": chosen.recompute_s, "optimizer_s": chosen.optimizer_s,
        "memory_bytes": chosen.memory_bytes, "state_bytes": chosen.state_bytes, "budget_bytes": budget,
        "link": link.name,
        "sequential_mesh": None if sequential is None else _mesh(estimates[sequential].axes),
        "sequential_step_time_s": None if sequential is None else estimates[sequential].time_s,
        "candidates": [dict(mesh=_mesh(e.axes), step_time_s=e.time_s, comm_s=e.comm_s, recompute_s=e.recompute_s,
                            memory_bytes=e.memory_bytes, fits=e.fits) for e in estimates],
        "solve_s": time.perf_counter() - start,
    }
    return dataclasses.replace(plans[joint], predicted=predicted)


def _sequential(estimates: list[Estimate]) -> int | None:
    """Shard first, then rematerialize: the candidate fastest without recomputation among those whose
    memory fits without it (all of them, if none does), then rematerialized; None if it cannot fit."""
    pool = [i for i, e in enumerate(estimates) if e.fits_without_remat] or range(len(estimates))
    best = min(pool, key=lambda i: estimates[i].time_s - estimates[i].recompute_s)
    return best if estimates[best].fits else None


def _mesh(axes: Axes) -> str:
    return ",".join(f"{r}={s}" for r, s in axes)
