"""One DP over the layers: per layer, how it is parallelized; across each cut, where its activations live;
joint with rematerialization.

A layer's options (choose.py costs them) combine: its parameters sharded on the fsdp axis or
replicated; tensor parallelism on or off; and the placement on the tp axis of the activations it
reads and writes ("S": the batch sharded over tp, sequence parallelism along the batch; "R": the
tp group's whole batch on every rank of it, computed redundantly). Moving from one placement to the
other at a cut costs communication (`switch`). The DP walks the layers with state = (placement of the
activation crossing the cut, memory in use, quantized upward) and value = least seconds. Each end
state leaves the rest of the budget to activations: it pays the recompute time of the cheapest point
of the rematerialization DP's Pareto frontier that frees what does not fit. The best end state, traced
back, is the plan. Quantization only rounds memory up, so the plan it picks fits.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np

from .plan import ParallelPlan

UNITS = 4096        # memory axis length: the DP is O(layers x options x placements x UNITS)
PLACES = ("S", "R")


@dataclasses.dataclass(frozen=True)
class Option:
    state_bytes: float      # parameters, gradients, optimizer state, gathered copies, its activations
    exposed_s: float        # seconds on the critical path: compute and communication
    place: str | None = "S"  # tp-axis placement of the activations it reads and writes; None: whatever
                             # placement reaches it (a layer that is not a module cannot be moved)
    key: Any = None         # what the caller needs to emit it


def replicate(plan: ParallelPlan, fqns: list[str]) -> ParallelPlan:
    """`plan` with these parameters replicated on the fsdp axis."""
    axis = [r for r, _ in plan.axes].index("fsdp")
    storage = dict(plan.storage)
    for f in fqns:
        storage[f] = tuple("R" if i == axis else p for i, p in enumerate(storage[f]))
    return dataclasses.replace(plan, storage=storage)


def solve(options: list[list[Option]], switch: Callable[[int, str, str], float], fixed_bytes: float,
          limit: float, remat: Callable[[np.ndarray], np.ndarray]) -> tuple[list[Option], float] | None:
    """The option per layer minimizing total seconds (exposed + placement switches + recompute), or None
    if nothing fits. `switch(i, a, b)` is the cost of moving layer i's input from placement a to b (the
    input arrives in "S"; i = len(options): the last layer's output, which leaves in "S"); `fixed_bytes` is the rest of the peak; `remat(excess)` gives, per entry of an
    array of byte excesses, the recompute seconds that free it (0 where not positive, inf where nothing
    frees enough)."""
    base = [min(o.state_bytes for o in opts) for opts in options]
    top = sum(max(o.state_bytes for o in opts) for opts in options)
    quantum = max((top - sum(base)) / UNITS, 1.0)
    best = {"S": np.zeros(1)}
    trace = []          # per layer: place -> (option index per memory, previous place index per memory)
    for i, opts in enumerate(options):
        new, pick, came = {}, {}, {}
        for k, o in enumerate(opts):
            units = math.ceil((o.state_bytes - base[i]) / quantum)
            for prev, values in best.items():
                to = prev if o.place is None else o.place
                cand = np.concatenate([np.full(units, np.inf), values + o.exposed_s + switch(i, prev, to)])
                cur = new.get(to)
                if cur is None:
                    new[to] = cand
                    pick[to] = np.full(len(cand), k)
                    came[to] = np.full(len(cand), PLACES.index(prev))
                    continue
                n = max(len(cur), len(cand))
                cur, cand = _pad(cur, n), _pad(cand, n)
                better = cand < cur
                new[to] = np.where(better, cand, cur)
                pick[to] = np.where(better, k, _pad(pick[to], n, -1))
                came[to] = np.where(better, PLACES.index(prev), _pad(came[to], n, -1))
        best = new
        trace.append((pick, came))
    end = None
    for place, values in best.items():   # the output leaves in "S" (the rank's batch shard)
        total = (values + switch(len(options), place, "S")
                 + remat(sum(base) + np.arange(len(values)) * quantum + fixed_bytes - limit))
        m = int(np.argmin(total))
        if np.isfinite(total[m]) and (end is None or total[m] < end[0]):
            end = (float(total[m]), place, m)
    if end is None:
        return None
    total, place, m = end
    chosen = []
    for i in reversed(range(len(options))):
        pick, came = trace[i]
        o, prev = options[i][int(pick[place][m])], PLACES[int(came[place][m])]
        chosen.append(o)
        m -= math.ceil((o.state_bytes - base[i]) / quantum)
        place = prev
    return chosen[::-1], float(total)


def _pad(values: np.ndarray, n: int, fill=np.inf) -> np.ndarray:
    return np.concatenate([values, np.full(n - len(values), fill, dtype=values.dtype)])
