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
- rematerialization: if the prediction is over the budget, the cheapest point of the remat DP's
  Pareto frontier that frees enough activation memory; its recompute time is added. None frees
  enough: the candidate does not fit.
The joint choice is the fastest candidate that fits with its rematerialization. For comparison the
sequential choice (shard first, then rematerialize, as Colossal-Auto does) is the fastest candidate
whose state fits without rematerialization, then rematerialized; the joint one is never slower.
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
from .comm import Link
from .mesh import Axes
from .plan import ParallelPlan
from .strategy import TPLayout, nbytes, plan_for


@dataclasses.dataclass(frozen=True)
class Single:
    """The numbers of the rank's single-device step that the candidates scale."""
    compute_s: float             # forward + backward
    matmul_share: float          # of compute_s
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
        return cls(compute, float(times[matmul].sum()) / compute if compute else 0.0, ev["est_optimizer_time_s"],
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
    stored = used = comm = 0.0
    for fqn, p in params.items():
        elem = p.element_size()
        here = math.prod(plan.local_shape(fqn, tuple(p.shape), origin)) * elem
        whole = math.prod(plan.local_shape(fqn, tuple(p.shape), origin, compute=True)) * elem
        stored, used = stored + here, used + whole
        fsdp = next((n for (r, n), pl in zip(plan.axes, plan.storage[fqn]) if r == "fsdp" and pl != "R"), 1)
        comm += link.all_gather(whole, fsdp) + link.reduce_scatter(whole, fsdp)   # gather; reduce grads
        comm += link.all_reduce(whole / fsdp, sizes.get("dp", 1))
    comm += sum(2 * link.all_reduce(nbytes(n) * n_tp, n_tp) for n in tp.row_outputs) if n_tp > 1 else 0.0
    comm += sum(link.all_gather(nbytes(n) * n_tp, n_tp) for n in tp.gathered) if n_tp > 1 else 0.0
    state = int(stored * (2 + single.optimizer_ratio) + (used - stored))
    memory = state + int(single.transient_bytes * s_act)
    limit = math.inf if budget is None else budget * (1 - planner.HEADROOM)
    recompute, fits = 0.0, memory <= limit
    if not fits:
        enough = np.nonzero(single.freed * s_act >= memory - limit)[0]
        if len(enough):
            k = int(enough[np.argmin(single.recompute_s[enough])])
            recompute = float(single.recompute_s[k]) * (single.matmul_share + (1 - single.matmul_share) * s_act)
            memory, fits = int(memory - single.freed[k] * s_act), True
    optimizer = single.optimizer_s * stored / max(single.param_bytes, 1)
    return Estimate(plan.axes, compute, comm, recompute, optimizer, memory, state, fits, recompute == 0.0 and fits)


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
            f"COLAUTO_MEMORY_BUDGET: no mesh fits {budget / 2**30:.2f} GiB per device; the smallest "
            f"prediction is {least.memory_bytes / 2**30:.2f} GiB ({_mesh(least.axes)}): raise the budget, "
            "use more devices or shrink the batch", int(least.memory_bytes / (1 - planner.HEADROOM)) + 1)
    joint = min(fitting, key=lambda i: estimates[i].time_s)
    no_remat = [i for i in fitting if estimates[i].fits_without_remat]
    sequential = min(no_remat, key=lambda i: estimates[i].time_s - estimates[i].recompute_s) if no_remat else joint
    chosen = estimates[joint]
    predicted = {
        "step_time_s": chosen.time_s, "compute_s": chosen.compute_s, "comm_s": chosen.comm_s,
        "recompute_s": chosen.recompute_s, "optimizer_s": chosen.optimizer_s,
        "memory_bytes": chosen.memory_bytes, "state_bytes": chosen.state_bytes, "budget_bytes": budget,
        "link": link.name, "sequential_mesh": _mesh(estimates[sequential].axes),
        "sequential_step_time_s": estimates[sequential].time_s,
        "candidates": [dict(mesh=_mesh(e.axes), step_time_s=e.time_s, comm_s=e.comm_s, recompute_s=e.recompute_s,
                            memory_bytes=e.memory_bytes, fits=e.fits) for e in estimates],
        "solve_s": time.perf_counter() - start,
    }
    return dataclasses.replace(plans[joint], predicted=predicted)


def _mesh(axes: Axes) -> str:
    return ",".join(f"{r}={s}" for r, s in axes)
