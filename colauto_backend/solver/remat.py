r"""Rematerialization as a dynamic program over the forward graph in topological order.

Problem (`RematProblem`, forward nodes 0..n-1 in topological order):
  size[i]    memory units node i's output holds if it is kept for backward
  time[i]    seconds to recompute node i in backward
  inputs[i]  forward nodes node i reads (parameters and graph inputs are always available)
  needed[i]  backward reads node i directly
  keep_time[i] seconds that keeping node i costs (optional: under Inductor a fused intermediate that is
             kept must be written in forward and read in backward; recomputing it fuses for free)
A plan keeps a set K. Node i is *demanded* if needed[i], or if a demanded node that is recomputed
reads it. A demanded node is kept (cost size[i] memory) or recomputed (cost time[i], and all its
inputs become demanded). Objective: for every memory level m, the least added time
    T(m) = min_K { sum_{i demanded, not in K} time[i] + sum_{i demanded, in K} keep_time[i]
                   :  sum_{i demanded, i in K} size[i] <= m }.

DP. Walk the nodes from last to first. The state after visiting nodes j..n-1 is D, the set of
not-yet-visited nodes that visited, recomputed nodes demand (a subset of the tensors live across
position j, so it stays small: the residual stream and a few attention tensors in a transformer).
Value: an array over exact memory m of the least time. Visiting node j with state D:
    demanded = needed[j] or j in D;  D0 = D - {j}
    not demanded:          V'[D0][m]                 <- V[D][m]
    keep (if allowed):     V'[D0][m + size[j]]       <- V[D][m] + keep_time[j]
    recompute (if allowed):V'[D0 | inputs[j]][m]     <- V[D][m] + time[j]
Each transition keeps a back-pointer, so any point of the final Pareto frontier (memory, time)
can be turned back into per-node decisions. Complexity: O(n * S * M) for S states per step and M
memory units (sizes are quantized so that M stays near `units`; only keepable nodes take units);
exact for the quantized sizes, which the brute-force tests check.
"""
from __future__ import annotations

import dataclasses

import numpy as np

INF = float("inf")
KEEP, RECOMPUTE, SKIP = 1, 2, 0


@dataclasses.dataclass(frozen=True)
class RematProblem:
    size: tuple[int, ...]
    time: tuple[float, ...]
    inputs: tuple[tuple[int, ...], ...]
    needed: tuple[bool, ...]
    can_keep: tuple[bool, ...]
    can_recompute: tuple[bool, ...]
    keep_time: tuple[float, ...] = ()     # empty: keeping costs no time

    def __post_init__(self) -> None:
        n = len(self.size)
        if not self.keep_time:
            object.__setattr__(self, "keep_time", (0.0,) * n)
        if not all(len(f) == n for f in (self.time, self.inputs, self.needed, self.can_keep, self.can_recompute,
                                         self.keep_time)):
            raise ValueError("RematProblem: all fields need one entry per node")
        for i, ins in enumerate(self.inputs):
            if any(not 0 <= p < i for p in ins):
                raise ValueError(f"RematProblem: node {i} reads a node that is not before it")


@dataclasses.dataclass
class Frontier:
    """Pareto-optimal plans: memory strictly increasing, recompute time strictly decreasing."""
    memory: np.ndarray                       # memory units of each point
    time: np.ndarray                         # recompute seconds of each point
    _back: list = dataclasses.field(repr=False)   # per node: (states before it, {state: (src, choice)}),
    # src/choice arrays over memory units, or plain ints where one option reaches the state
    _size: tuple[int, ...] = dataclasses.field(repr=False)
    states: int = 0                          # the most DP states at any step (its width: graph.solver_order)
    pruned_steps: int = 0                    # steps where states past `max_states` were dropped (0: exact)

    def choices(self, k: int) -> tuple[int, ...]:
        """Per-node decisions of point k: KEEP, RECOMPUTE, or SKIP (not demanded by backward)."""
        decisions = []
        state, m = frozenset(), int(self.memory[k])
        for j, (before, table) in enumerate(self._back):   # node 0 first: back-tracking order
            src, choice = table[state]    # arrays over memory, or one (source, choice) for every m
            c = int(choice[m]) if isinstance(choice, np.ndarray) else choice
            decisions.append(c)
            state = before[int(src[m]) if isinstance(src, np.ndarray) else src]
            if c == KEEP:
                m -= self._size[j]
        return tuple(decisions)

    def keep(self, k: int) -> tuple[bool, ...]:
        """Per-node decisions of point k: True = keep for backward, False = recompute or not needed."""
        return tuple(c == KEEP for c in self.choices(k))


def solve(p: RematProblem, max_states: int | None = None) -> Frontier:
    """The exact Pareto frontier of (kept memory, recompute time) by the DP in the module docstring.
    A state's value array ends at its last own Pareto point: units past it are unreachable or dominated
    (infinite time), and so is any entry no lower than one at less memory, which stays dominated whatever
    follows. So a node that adds nothing to a state copies nothing, and HF Pythia-410M's arrays average a
    few hundred units, not 1,180. Back-pointers take the smallest integer type that holds them: on HF
    Qwen2 at its bench shape (2,321 nodes, 4,105 units) they were 523 MB as int64, and filling that memory
    was most of the solve time.

    `max_states`: a bound on the states kept after each step. Past it, the states with the fewest pending
    reads (then the least time at their least memory) are kept and the rest dropped, so the frontier is
    made of real plans but may miss better ones (`pruned_steps` counts such steps; the caller reports it).
    None: exact."""
    n = len(p.size)
    pruned = 0
    values: dict[frozenset, np.ndarray] = {frozenset(): np.zeros(1)}
    back: list = [None] * n
    widest = 1
    for j in range(n - 1, -1, -1):
        size = p.size[j] if p.can_keep[j] else 0
        before = list(values)
        cands: dict[frozenset, list] = {}   # state -> [(values, offset, added time, source, choice)]
        for idx, (state, v) in enumerate(values.items()):
            rest = state - {j}
            if not (p.needed[j] or j in state):
                cands.setdefault(rest, []).append((v, 0, 0.0, idx, SKIP))
                continue
            if p.can_keep[j]:
                cands.setdefault(rest, []).append((v, size, p.keep_time[j], idx, KEEP))
            if p.can_recompute[j]:
                cands.setdefault(rest | frozenset(p.inputs[j]), []).append((v, 0, p.time[j], idx, RECOMPUTE))
        src_type = np.int8 if len(before) < 128 else np.int16 if len(before) < 2 ** 15 else np.int64
        values, table = {}, {}
        for state, options in cands.items():
            if len(options) == 1:         # one way to reach this state: no minimum to take
                v, off, add, src, choice = options[0]
                if add:
                    v = v + add
                if off:
                    v = np.concatenate((np.full(off, INF), v))
                values[state], table[state] = v, (src, choice)
                continue
            # the options folded in order, each replacing the best so far where strictly lower (the
            # first of equal options wins, as an argmin over them would choose)
            length = max(off + len(v) for v, off, _, _, _ in options)
            v, off, add, src, choice = options[0]
            best = np.full(length, INF)
            best[off:off + len(v)] = v + add if add else v
            srcs = np.full(length, src, dtype=src_type)
            chosen = np.full(length, choice, dtype=np.int8)
            for v, off, add, src, choice in options[1:]:
                seg = slice(off, off + len(v))
                w = v + add if add else v
                lower = w < best[seg]
                best[seg] = np.where(lower, w, best[seg])
                srcs[seg][lower] = src
                chosen[seg][lower] = choice
            # an entry with no less time than one at less memory can never become a frontier point
            # (every later transition adds the same to both): set to infinity, and the array cut after
            # the state's last frontier point
            frontier = np.empty(length, dtype=bool)
            frontier[0] = best[0] < INF
            np.less(best[1:], np.minimum.accumulate(best)[:-1], out=frontier[1:])
            points = np.flatnonzero(frontier)
            if not len(points):           # no way to reach this state: dropped
                continue
            end = int(points[-1]) + 1
            best = np.where(frontier[:end], best[:end], INF)
            values[state] = best
            table[state] = (srcs[:end], chosen[:end])
        back[j] = (before, table)
        widest = max(widest, len(values))
        if max_states is not None and len(values) > max_states:
            kept = sorted(values, key=lambda st: (len(st), float(values[st].min())))[:max_states]
            values = {st: values[st] for st in kept}
            pruned += 1
    final = values.get(frozenset(), np.full(1, INF))
    # Pareto points: strictly less time than any smaller memory
    prior = np.minimum.accumulate(np.concatenate(([INF], final[:-1])))
    mems = np.flatnonzero(final < prior)
    return Frontier(mems.astype(np.int64), final[mems].astype(float), back, p.size, widest, pruned)


def evaluate(p: RematProblem, keep: tuple[bool, ...]) -> tuple[int, float] | None:
    """(memory, added time) of keeping exactly `keep`; None if a demanded node can be neither."""
    demanded = list(p.needed)
    mem, t = 0, 0.0
    for j in range(len(p.size) - 1, -1, -1):
        if not demanded[j]:
            continue
        if keep[j]:
            if not p.can_keep[j]:
                return None
            mem += p.size[j]
            t += p.keep_time[j]
        else:
            if not p.can_recompute[j]:
                return None
            t += p.time[j]
            for i in p.inputs[j]:
                demanded[i] = True
    return mem, t
