"""Per layer, shard its parameters over the fsdp axis or replicate them: one DP over the layers, joint
with rematerialization.

A sharded layer holds 1/F of its gradients and optimizer state but gathers its parameters before use
(exposed communication); a replicated one holds everything and only all-reduces gradients (hidden
behind backward compute while the reductions fit in it). The DP walks the layers with state = model
memory in use (quantized upward) and value = least exposed seconds, a multiple-choice knapsack. Each
end state leaves the rest of the budget to activations: it pays the recompute time of the cheapest
point of the rematerialization DP's Pareto frontier that frees what does not fit. The best end state,
traced back, is the plan. Quantization only rounds memory up, so the plan it picks fits.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np

from ..analysis import layer_of
from .plan import ParallelPlan

UNITS = 4096        # memory axis length: the DP is O(layers x UNITS)


@dataclasses.dataclass(frozen=True)
class Option:
    state_bytes: float      # parameters, gradients, optimizer state, gathered copies
    exposed_s: float        # communication on the critical path


def replicate(plan: ParallelPlan, fqns: list[str]) -> ParallelPlan:
    """`plan` with these parameters replicated on the fsdp axis."""
    axis = [r for r, _ in plan.axes].index("fsdp")
    storage = dict(plan.storage)
    for f in fqns:
        storage[f] = tuple("R" if i == axis else p for i, p in enumerate(storage[f]))
    return dataclasses.replace(plan, storage=storage)


def mix(plan: ParallelPlan, options: Callable[[ParallelPlan, list[str]], Option], fixed_bytes: float,
        limit: float, remat: Callable[[float], float | None]) -> tuple[ParallelPlan, list[str]]:
    """The plan with each layer sharded or replicated on the fsdp axis, and the replicated layers.
    `options(plan, fqns)` costs those parameters under `plan`; `fixed_bytes` is the rest of the peak
    (activations and temporaries); `remat(excess)` is the recompute seconds that free `excess` bytes,
    None if nothing does."""
    groups: dict[str, list[str]] = {}
    for fqn, spec in plan.storage.items():
        if "S" in "".join(spec):
            groups.setdefault(layer_of(fqn), []).append(fqn)
    names = list(groups)
    if not names:
        return plan, []
    both = [(options(plan, groups[g]), options(replicate(plan, groups[g]), groups[g])) for g in names]
    base = sum(min(s.state_bytes, r.state_bytes) for s, r in both)
    top = sum(max(s.state_bytes, r.state_bytes) for s, r in both)
    quantum = max((top - base) / UNITS, 1.0)
    best = np.zeros(1)
    choice = []                                      # per layer: True where replicating was best
    for s, r in both:
        shard = _shift(best, math.ceil((s.state_bytes - min(s.state_bytes, r.state_bytes)) / quantum), s.exposed_s)
        rep = _shift(best, math.ceil((r.state_bytes - min(s.state_bytes, r.state_bytes)) / quantum), r.exposed_s)
        n = max(len(shard), len(rep))
        shard, rep = _pad(shard, n), _pad(rep, n)
        choice.append(rep < shard)
        best = np.minimum(shard, rep)
    total = np.full(len(best), np.inf)
    for m in np.nonzero(np.isfinite(best))[0]:
        extra = remat(base + m * quantum + fixed_bytes - limit)
        if extra is not None:
            total[m] = best[m] + extra
    if not np.isfinite(total).any():
        return plan, []
    m = int(np.argmin(total))
    replicated = []
    for g, (s, r), pick in reversed(list(zip(names, both, choice))):
        if pick[m]:
            replicated.append(g)
            m -= math.ceil((r.state_bytes - min(s.state_bytes, r.state_bytes)) / quantum)
        else:
            m -= math.ceil((s.state_bytes - min(s.state_bytes, r.state_bytes)) / quantum)
    return replicate(plan, [f for g in replicated for f in groups[g]]), sorted(replicated)


def _shift(values: np.ndarray, units: int, cost: float) -> np.ndarray:
    return np.concatenate([np.full(units, np.inf), values + cost])


def _pad(values: np.ndarray, n: int) -> np.ndarray:
    return np.concatenate([values, np.full(n - len(values), np.inf)])
