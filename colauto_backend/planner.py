"""Choose what to recompute so the whole step fits the memory budget at the least added time.

1. The unplanned partition is tried first: aten codegen saves everything backward needs; Inductor
   codegen uses Inductor's min-cut partition (torch.compile's default). If its simulated peak fits,
   it is the plan.
2. Otherwise the DP (solver/remat.py) gives the exact Pareto frontier of (bytes kept for backward,
   recompute time) over the forward DAG (graph.py). A fixed set of frontier points (all, or
   MAX_CANDIDATES spread evenly) become candidate plans; under Inductor codegen also those of the frontier
   under the older pricing (`_solve(extern=False)`: every recomputed memory-bound value fused into its
   reader), which reaches lower peaks, chosen among by the same modeled step time. Under Inductor
   codegen a candidate may fix only the compute-bound nodes (matmuls, attention); the min-cut
   partitioner places the fusible ops around them (emit/remat.py).
3. Each candidate that decides every node has its partition modeled, not run
   (cost/memory.predict_partition: which values the partitioner saves and recomputes, and the step's
   liveness at the example sizes; under Inductor and Triton codegen with Inductor's fusion, as the
   chosen plan's real partition is simulated), for up to MAX_MODELED frontier points. The modeled plan
   is the candidate with the least predicted step time whose modeled peak fits (under min-cut, found in
   about 2 sqrt(MAX_MODELED) modeled peaks by `first_fitting`: exact where the peak falls along the
   candidates as their time grows, as along the DP's frontier, give or take the model); its real partition is
   then run and simulated, and if that peak does not fit, the next candidate is tried
   (`Plan.model_misses`), skipping those the model's error on the missed one puts over the budget. The
   model is exact for aten's default_partition; under min-cut its peak equalled the real partition's
   on the HF models checked (tests/test_remat_inductor.py), though min-cut also places the untagged
   views, so the chosen plan is still checked on its real partition.
   explain() reports the modeled plan without partitioning where the model is exact (aten:
   Planner.plan(partition=False)); otherwise it reports the real partition of the plan, as compiling does.
4. Under Inductor and Triton codegen, the candidates that fix only the compute-bound nodes (min-cut
   places all the rest, which no model predicts) are searched on real partitions only where no modeled
   candidate fits (near the least feasible budget): a lower bound of each one's time
   (`Planner._least_time`) prunes them, and along the frontier, cut where the DP starts recomputing
   fewer nodes (the real peak can rise there), a bisection per run finds the first that fits. Searched
   beside a fitting modeled choice, they changed no plan of HF Qwen2 and Llama at their bench widths
   before 2026-12-07 (6 budgets each) nor of GPT-2 124M at its bench shape since (100% and 75% of its
   activations), and cost half of a budgeted plan's time (HF Qwen2 at its bench shape, 75%: 6.7 s with
   2 such partitions, on a 2-core CPU); on the project's tiny GPT-2 under the CPU preset, one found at
   the least budget is 2% faster at less memory than the modeled choice of a larger budget, where the
   search does not run.
"Fits" means a simulated peak within the budget less HEADROOM (0.5%, for allocations the model does
not see). The candidate set does not depend on the budget, and a smaller budget only shrinks the set
of candidates that fit; the choice among them is monotone where the model is exact (aten). Where it
is not, a model miss or the bisection can pass over a fitting candidate, so a smaller budget can
(rarely) get a slightly faster plan.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import math
import time
from typing import Any, Callable

import torch.fx as fx

from . import counters, graph, plan_cache
from ._torch_compat import PassThroughError
from .analysis import Analysis, layer_of
from .cost.memory import PredictedPartition
from .emit import remat as emit
from .report import fmt_bytes
from .solver import remat as solver

# The DP's states past which it keeps the likeliest and drops the rest (solver.solve's max_states). The
# tiny HF models hold 8-576 (Qwen2-MoE 576, GPT-NeoX 360, the Llama family 176; 2026-12-06). A graph whose
# states multiply with depth once planned for minutes with no word (BLOOM before graph.solver_order); in
# that order, bounded here: 23.5 s and 2.5 GB on a 2-core CPU, 188 of the exact 241 frontier points (at
# 512: 5.5 s, 157 points). Counted here and named in the plan's report line.
MAX_DP_STATES = 2048
DP_PRUNED = counters.counter("remat DP pruned")


# Share of the budget left for allocations the memory model does not see. On an H200 the unplanned
# step's measured peak ran 0.1-0.4% above its prediction (bench/results/h200-2026-11-26-memcheck).
HEADROOM = 0.005

# Frontier points whose peak may be simulated (each costs one partition + memory simulation).
MAX_CANDIDATES = 12
# Frontier points whose partition is modeled (each costs one liveness pass at the example sizes).
MAX_MODELED = 64
# Real partitions that may check modeled candidates for one budget (planner.Planner._probe).
MAX_PROBES = 6


class BudgetError(PassThroughError):
    """No plan fits COLAUTO_MEMORY_BUDGET; `smallest_bytes` is the least budget that would work. One line;
    raised inside torch.compile it reaches the caller unwrapped (a RuntimeError, as before)."""

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
    partitions_run: int = 0               # candidate partitions this plan ran (the others were reused)
    modeled_plans: int = 0                # candidates whose partition was modeled, not run (their peaks
                                          # replayed in order of modeled time, until the choice is made)
    peak_modeled_bytes: int = 0           # the model's peak for the chosen plan (0: not modeled)
    partition_checked: bool = True        # peak_with_bytes is the real partition's (explain: the model's)
    model_misses: int = 0                 # chosen by the model, rejected by their real partition
    cache: str = ""                       # the on-disk plan cache: hit, stored, "stale, replaced", not stored: why
    chunked_losses: int = 0               # losses whose gradient the forward computes (chunked_loss.py)
    quantum_bytes: float = 0.0
    solve_s: float = 0.0                  # problem construction + DP
    plan_s: float = 0.0                   # everything, simulations of candidate plans included
    dp_pruned_steps: int = 0              # DP steps past MAX_DP_STATES (0: the frontier is exact)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@contextlib.contextmanager
def gc_off():
    """Python's cyclic garbage collector off inside the block (and back on after, if it was on).
    Capturing, partitioning, planning and compiling allocate many small objects while the traced graphs
    and fake tensors fill the heap, so each full collection scans all of those: planning HF Qwen2 at its
    bench shape (24 layers, B8 x T1024, under 17.7 GiB for an H200, codegen inductor) took 6.9 s with the
    collector on and 3.4 s with it off on a 2-core CPU. What the block leaves unreachable is collected
    after it."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def gc_paused(fn: Callable) -> Callable:
    """`fn` run inside `gc_off()`."""
    @functools.wraps(fn)
    def paused(*args, **kwargs):
        with gc_off():
            return fn(*args, **kwargs)
    return paused


def resolve_budget(setting: tuple[str, float] | None, device_bytes: int) -> int | None:
    """Config's parsed COLAUTO_MEMORY_BUDGET -> bytes (None: no budget). Default: the device's memory."""
    if setting is None:
        return device_bytes
    kind, value = setting
    return None if kind == "none" else int(value * device_bytes) if kind == "fraction" else int(value)


@dataclasses.dataclass
class _Candidates:
    """The budget-independent part of planning one joint graph."""
    decisions: list[tuple]        # per candidate: tags for the partitioner, one per node of `names`
    bounds: list[float]           # per candidate: a lower bound of the bytes it keeps for backward
    searched: list[tuple]         # candidates (of `decisions`) the model cannot describe, fastest first
    frontier: solver.Frontier
    names: list[str]              # the DP's nodes, in solver order
    quantum: float                # bytes per memory unit
    solve_s: float                # problem construction + DP


class Planner:
    """Plans one captured joint graph at any number of budgets. What does not depend on the budget (the
    DP's frontier, the candidate set, each candidate's partition and simulated step) is computed at the
    first budget that needs it and reused, so a second budget costs no partition it has seen."""

    def __init__(self, joint: fx.GraphModule, partition: Callable, baseline: Analysis,
                 analysis_for: Callable[[fx.GraphModule, fx.GraphModule], Analysis],
                 buffers: frozenset[str] = frozenset(),
                 predict: Callable[[dict[str, bool]], PredictedPartition] | None = None,
                 cache_settings: tuple | None = None, exact: bool = False) -> None:
        """`predict`: the modeled partition of a candidate's tags (None: run every candidate's partition);
        `exact`: it is the partition (aten's default_partition), so explain() need not run it.
        `cache_settings`: what else the plan depends on (codegen, device, optimizer), for the on-disk plan
        cache (plan_cache.py); None: no cache."""
        self.joint, self.partition, self.baseline = joint, partition, baseline
        self.cache_settings = cache_settings
        self.analysis_for, self.buffers, self.predict, self.exact = analysis_for, buffers, predict, exact
        self.base = baseline.evaluate(baseline.hints)
        self._candidates: _Candidates | None = None
        self._simulated: dict[tuple, tuple[dict, tuple, Analysis]] = {}
        self._modeled: dict[tuple, tuple[dict, Analysis]] = {}
        self._times: dict[tuple, float] = {}        # modeled step time of each candidate (modeled_time)
        # the candidates this plan() call has partitioned (their partitions may be reused from an earlier
        # call): every choice reads these only, so a budget's plan does not depend on the budgets planned
        # before it with the same planner (explain at several budgets, the backend's looser re-plans)
        self._run_now: list[tuple] = []
        self._again = {c.name: float(t) for c, t in zip(baseline.costs.nodes, self.base["_recompute_times"])}
        # forward nodes backward reads, through views, and the view nodes' names (_least_time)
        self._read_by_backward: tuple[list[fx.Node], set[str]] | None = None

    @gc_paused
    def plan(self, budget: int | None, partition: bool = True) -> tuple[Plan, tuple | None, Analysis]:
        """(plan, (fw, bw) or None where the unplanned partition fits, analysis of the chosen partition).
        partition=False (explain): a modeled plan is described as the model predicts it, not partitioned,
        and the plan cache is neither read nor written."""
        start, seen = time.perf_counter(), len(self._simulated)
        self._run_now = []
        base, baseline = self.base, self.baseline
        limit = float("inf") if budget is None else budget * (1 - HEADROOM)
        if base["peak_memory_bytes"] <= limit:
            return _describe(budget, base, base, baseline, None, 0, 0.0, 0.0, start), None, baseline
        if not partition or self.cache_settings is None:
            return self._choose(budget, limit, partition, start, seen)[:3]
        digest = plan_cache.key(self.joint, (*self.cache_settings, budget, HEADROOM, self.buffers,
                                             sorted((str(k), v) for k, v in baseline.hints.items())))
        stored = plan_cache.load(digest)
        if stored is not None:
            ev, graphs, analysis = self._partition(tuple(stored["names"]), tuple(stored["keep"]))
            if ev["peak_memory_bytes"] <= limit:
                described = _describe(budget, base, ev, analysis, None, 1, 0.0, 0.0, start)
                return dataclasses.replace(described, partitions_run=1, cache="hit"), graphs, analysis
        described, graphs, analysis, keep = self._choose(budget, limit, partition, start, seen)
        error = plan_cache.store(digest, {"names": self._candidate_set().names, "keep": list(keep)})
        cache = "stale, replaced" if stored is not None else "stored"
        return dataclasses.replace(described, cache=cache if error is None else f"not stored: {error}"), graphs, analysis

    def _choose(self, budget: int | None, limit: float, partition: bool, start: float,
                seen: int) -> tuple[Plan, tuple | None, Analysis, tuple]:
        """The plan over the candidate set (the DP's frontier), and the chosen candidate's tags."""
        base = self.base
        cands = self._candidate_set()
        if self.predict is not None:
            return self._plan_modeled(budget, limit, cands, partition, start, seen)
        # no model: every candidate is partitioned (kept for callers that pass no `predict`)
        # Lower bound of any plan's peak: what is held all step plus what the plan keeps for backward.
        held = base["param_bytes"] + base["optimizer_state_bytes"] + base["input_bytes"]
        simulated = {}
        for keep, bound in zip(cands.decisions, cands.bounds):
            if held + bound <= limit:
                simulated[keep] = self.partitioned(keep)
        fits = [keep for keep, v in simulated.items() if v[0]["peak_memory_bytes"] <= limit]
        if fits:
            keep = min(fits, key=lambda k: simulated[k][0]["est_step_time_s"])
            ev, graphs, analysis = simulated[keep]
            described = _describe(budget, base, ev, analysis, cands.frontier, len(simulated),
                                  cands.quantum, cands.solve_s, start)
            return dataclasses.replace(described, partitions_run=len(self._simulated) - seen), graphs, analysis, keep
        # nothing fits: find the least peak among the candidates to tell the user
        least = min((self.partitioned(keep)[0] for keep in cands.decisions), key=lambda ev: ev["peak_memory_bytes"])
        raise _budget_error(budget, least)

    def _plan_modeled(self, budget: int | None, limit: float, cands: "_Candidates", partition: bool,
                      start: float, seen: int) -> tuple[Plan, tuple | None, Analysis, tuple]:
        """Choose among modeled candidates; with `partition`, confirm the choice on its real partition.
        A candidate's modeled step time needs only which nodes its partition recomputes (cheap,
        `modeled_time`); its modeled peak needs the liveness replay, so peaks are modeled in order of
        time, only until the choice is made. The candidates the model cannot describe (`cands.searched`)
        are searched on real partitions only where no modeled candidate fits."""
        searched = set(cands.searched)
        # fastest first; sorted() is stable, so equal times keep the candidates' order (fastest point first)
        order = sorted((keep for keep in cands.decisions if keep not in searched), key=self.modeled_time)
        misses, chosen = 0, None
        # exact (aten): every candidate faster than the choice is replayed, so the choice is the fastest that
        # fits and is monotone in the budget, and the least budget BudgetError names has a plan
        first_fit = next((keep for keep in order if self._peak(keep) <= limit), None) if self.exact else None
        if first_fit is not None and not partition and first_fit not in self._run_now:
            ev, analysis = self.modeled(first_fit)   # the model is the partition: described without running it
            chosen = (first_fit, ev, None, analysis, False)
        elif not (self.exact and first_fit is None):   # exact: no real partition fits where no model does
            chosen, misses = self._probe(order, limit)
        if chosen is None:     # no modeled candidate fits: the compute-only ones, which min-cut completes
            found = self._search(cands.searched, limit)
            chosen = None if found is None else (*found, True)
        if chosen is None:     # the least peak known, to tell the user (every candidate run included)
            least = [self._simulated[keep][0] for keep in self._run_now]
            least_keep = min(order, key=self._peak, default=None)
            if least_keep is not None:
                least.append(self.modeled(least_keep)[0] if self.exact and not partition
                             else self.partitioned(least_keep)[0])
            raise _budget_error(budget, min(least, key=lambda ev: ev["peak_memory_bytes"]))
        keep, ev, graphs, analysis, checked = chosen
        described = _describe(budget, self.base, ev, analysis, cands.frontier,
                              len(self._simulated) - seen if checked else 0, cands.quantum, cands.solve_s, start)
        ev_model = self._modeled.get(keep, (None,))[0]
        return dataclasses.replace(described, partitions_run=len(self._simulated) - seen,
                                   modeled_plans=len(order), model_misses=misses,
                                   partition_checked=checked,
                                   peak_modeled_bytes=ev_model["peak_memory_bytes"] if ev_model else 0,
                                   ), graphs, analysis, keep

    def _probe(self, order: list[tuple], limit: float) -> tuple[tuple | None, int]:
        """The fastest modeled candidate (`order`: fastest first) whose real partition fits, in a few real
        partitions: each probe is the fastest candidate not yet run whose modeled peak, scaled by the
        median real/modeled ratio of the partitions run so far (1 before any; exact for aten), fits
        (`first_fitting`: a few modeled peaks, not one per candidate faster than the choice); a
        candidate already run counts at its real peak. It stops when no candidate faster than the best
        that fits is left to try, or after MAX_PROBES. (chosen or None, probes that did not fit)."""
        def fastest_fit() -> tuple | None:
            found = self._fastest_partitioned(order, limit)
            return None if found is None else (*found, True)
        misses = 0
        for _ in range(MAX_PROBES):
            best, ratios = fastest_fit(), sorted(self._ratios())
            scale = ratios[len(ratios) // 2] if ratios else 1.0
            untried = [keep for keep in order if keep not in self._run_now
                       and (best is None or self.modeled_time(keep) < self.modeled_time(best[0]))]
            probe = first_fitting(untried, lambda keep: self._peak(keep) * scale <= limit)
            if probe is None:
                break
            ev = self.partitioned(probe)[0]
            misses += ev["peak_memory_bytes"] > limit
        if fastest_fit() is None:    # near the least feasible budget the model's error decides: try the
            for keep in sorted(order, key=self._peak)[:MAX_PROBES]:   # least modeled peaks for real,
                if keep in self._run_now:                             # while the model's smallest
                    continue                                          # real/modeled ratio seen lets one fit
                if self._ratios() and self._peak(keep) * min(self._ratios()) > limit:
                    break
                ev = self.partitioned(keep)[0]
                misses += ev["peak_memory_bytes"] > limit
                if fastest_fit() is not None:
                    break
        return fastest_fit(), misses

    def _search(self, ordered: list[tuple], limit: float) -> tuple[tuple, dict, tuple, Analysis] | None:
        """The fastest of `ordered` (fastest first) whose real partition fits (`_least_time` prunes those
        that cannot beat the best found so far). Along the frontier the DP recomputes more nodes
        point by point and the peak falls, but not across a point where it recomputes fewer, larger
        values instead: there the real peak can rise again (the DP's model of what min-cut keeps is not
        min-cut's; seen on HF Qwen2 at the logits). So `ordered` is cut into runs where the number of
        nodes tagged for recomputation grows, and each run's candidates that may beat the best found so
        far are bisected on real partitions (the slowest first: if it does not fit, none of the run does)."""
        if not ordered:
            return None
        forced = [sum(1 for k in keep if k is False) for keep in ordered]
        runs, run = [], [0]
        for i in range(1, len(ordered)):
            if forced[i - 1] <= forced[i]:
                run.append(i)
            else:
                runs.append(run)
                run = [i]
        runs.append(run)

        def fits(i: int) -> bool:
            return self.partitioned(ordered[i])[0]["peak_memory_bytes"] <= limit

        for run in runs:
            found = self._fastest_partitioned(ordered, limit)
            beat = found[1]["est_step_time_s"] if found is not None else math.inf
            # a candidate that forces no recomputation is min-cut's own partition with some values
            # pinned: no smaller than the unplanned one, which did not fit
            run = [i for i in run if forced[i] and self._least_time(ordered[i]) < beat]
            if not run or not fits(run[-1]):
                continue
            lo, hi = 0, len(run) - 1
            while lo < hi:
                mid = (lo + hi) // 2
                if fits(run[mid]):
                    hi = mid
                else:
                    lo = mid + 1
        return self._fastest_partitioned(ordered, limit)

    def _fastest_partitioned(self, keeps: list[tuple], limit: float) -> tuple[tuple, dict, tuple, Analysis] | None:
        """The fastest of `keeps` already partitioned whose real peak fits: (tags, evaluation, graphs,
        analysis), or None."""
        now = set(self._run_now)
        ran = [(keep, *self._simulated[keep]) for keep in keeps if keep in now
               and self._simulated[keep][0]["peak_memory_bytes"] <= limit]
        return min(ran, key=lambda r: r[1]["est_step_time_s"], default=None)

    def _least_time(self, keep: tuple) -> float:
        """A lower bound of the candidate's step time: the unplanned step plus the nodes it tags for
        recomputation that backward reads, directly or through other such nodes (min-cut may not save
        them, so it recomputes them; whatever else it recomputes only adds)."""
        names = self._candidate_set().names
        forced = {n for n, k in zip(names, keep) if k is False}
        if not forced:
            return self.base["est_step_time_s"]
        if self._read_by_backward is None:
            views = {c.name for c in self.baseline.costs.nodes if c.kind == "view"}
            # what backward reads, looking through views (a view of a value is that value's storage)
            read, stack = set(), [a for n in self.joint.graph.nodes if graph.is_backward(n)
                                  for a in n.all_input_nodes if not graph.is_backward(a)]
            while stack:
                a = stack.pop()
                if a not in read:
                    read.add(a)
                    if a.name in views:
                        stack.extend(a.all_input_nodes)
            self._read_by_backward = (list(read), views)
        read, views = self._read_by_backward
        again, stack = set(), [a for a in read if a.name in forced]
        while stack:
            a = stack.pop()
            if a.name not in again:
                again.add(a.name)
                stack.extend(x for x in a.all_input_nodes if x.name in forced or x.name in views)
        return self.base["est_step_time_s"] + math.fsum(self._again.get(n, 0.0) for n in again if n in forced)

    def candidates(self) -> list[tuple]:
        """Every candidate plan: its tags, one per node the DP decides (what `modeled` and `partitioned` take)."""
        return self._candidate_set().decisions

    def modeled_time(self, keep: tuple) -> float:
        """The candidate's modeled step time: what its modeled partition recomputes, without the liveness
        replay (computed once per candidate; `modeled` gives the same time)."""
        if keep not in self._times:
            if keep in self._modeled:
                self._times[keep] = self._modeled[keep][0]["est_step_time_s"]
            else:
                names = self._candidate_set().names
                pred = self.predict({n: k for n, k in zip(names, keep) if k is not None}, replay=False)
                again = math.fsum(self._again.get(n, 0.0) for n in pred.recomputed)   # a set: any order
                self._times[keep] = self.base["est_step_time_s"] + again
        return self._times[keep]

    def _peak(self, keep: tuple) -> int:
        return self.modeled(keep)[0]["peak_memory_bytes"]

    def modeled(self, keep: tuple) -> tuple[dict, Analysis]:
        """The candidate's modeled partition (`predict`), as the numbers plan() reads: evaluate()'s keys
        with the modeled peak, saved bytes and recompute time (computed once per candidate)."""
        if keep not in self._modeled:
            names = self._candidate_set().names
            pred = self.predict({n: k for n, k in zip(names, keep) if k is not None})
            again = math.fsum(self._again.get(n, 0.0) for n in pred.recomputed)   # a set: any order, one sum
            ev = dict(self.base, peak_memory_bytes=pred.peak_bytes, peak_at=pred.peak_at,
                      saved_activation_bytes=pred.saved_bytes, est_recompute_time_s=again,
                      est_step_time_s=self.base["est_step_time_s"] + again,
                      est_bwd_time_s=self.base["est_bwd_time_s"] + again)
            self._modeled[keep] = (ev, dataclasses.replace(self.baseline, recomputed=pred.recomputed))
        return self._modeled[keep]

    def _candidate_set(self) -> "_Candidates":
        if self._candidates is not None:
            return self._candidates
        start = time.perf_counter()
        baseline = self.baseline
        frontier, nodes, quantum, problem = _solve(self.joint, baseline, self.base, self.buffers)
        points = spread_points(len(frontier.memory), MAX_CANDIDATES if self.predict is None else MAX_MODELED)
        # A node the plan may not recompute (random ops, readers of module buffers) is tagged MUST_SAVE
        # where the DP did not keep it: "never recompute; save if backward reads it". MUST_RECOMPUTE there
        # made the min-cut partitioner (Inductor and Triton codegen) recompute it in backward anyway: a
        # BatchNorm re-reading running stats the step had updated in place, or SDPA with its RNG state
        # functionalized.
        fixed = [not r for r in problem.can_recompute]
        searched: list[tuple] = []
        if baseline.fused:   # each point twice: only its compute-bound decisions, and all of them
            compute = {c.name for c in baseline.costs.nodes if c.kind == "matmul"}
            decided = [_tags(frontier.choices(p), nodes, None, fixed) for p in points]
            if self.predict is not None:
                # and the points of the frontier priced as before 2026-12-07, where every recomputed
                # memory-bound value fuses into its reader: they reach lower peaks (GPT-2 124M at B16 on
                # an H200: 5.04 GiB modeled against 5.20 for the least of the frontier above), and the
                # modeled step time (the extern-aware pricing) decides between the two sets
                fused_only, fused_nodes, _, _ = _solve(self.joint, baseline, self.base, self.buffers, extern=False)
                assert [n.name for n in fused_nodes] == [n.name for n in nodes]
                decided += [_tags(fused_only.choices(p), nodes, None, fixed)
                            for p in spread_points(len(fused_only.memory), MAX_MODELED)]
            # compute-bound decisions only: min-cut places every other node, which no model predicts,
            # so these are searched on real partitions (at most MAX_CANDIDATES points)
            few = spread_points(len(frontier.memory)) if self.predict is not None else points
            compute_only = [_tags(frontier.choices(p), nodes, compute, fixed) for p in few]
            decisions = list(dict.fromkeys(compute_only + decided))
            if self.predict is not None:
                modeled = set(decided)
                searched = [d for d in dict.fromkeys(compute_only) if d not in modeled]
            bounds = [0.0] * len(decisions)    # min-cut may keep less than the DP did: no bound
        else:
            decisions = [tuple(k or f for k, f in zip(frontier.keep(p), fixed)) for p in points]
            bounds = [(frontier.memory[p] - len(nodes)) * quantum for p in points]
        self._candidates = _Candidates(decisions, bounds, searched, frontier, [n.name for n in nodes], quantum,
                                       time.perf_counter() - start)
        return self._candidates

    def partitioned(self, keep: tuple) -> tuple[dict, tuple, Analysis]:
        """The candidate's partition and its simulated step (computed once per candidate), counted as run
        by this plan() call."""
        if keep not in self._run_now:
            self._run_now.append(keep)
        return self._partition(tuple(self._candidate_set().names), keep)

    def _ratios(self) -> list[float]:
        """Real / modeled peak of each modeled candidate this plan() call partitioned."""
        return [self._simulated[keep][0]["peak_memory_bytes"] / self._peak(keep)
                for keep in self._run_now if keep in self._modeled]

    def _partition(self, names: tuple[str, ...], keep: tuple) -> tuple[dict, tuple, Analysis]:
        """The partition under tags `keep` on the nodes `names`, and its simulated step (once per tags)."""
        if keep not in self._simulated:
            emit.tag(self.joint.graph, names, keep)
            try:
                fw, bw = self.partition()
            finally:
                emit.untag(self.joint.graph)
            analysis = self.analysis_for(fw, bw)
            self._simulated[keep] = (analysis.evaluate(analysis.hints), (fw, bw), analysis)
        return self._simulated[keep]


def _budget_error(budget: int | None, least: dict) -> BudgetError:
    persistent = least["param_bytes"] + least["grad_bytes"] + least["optimizer_state_bytes"]
    needed = int(least["peak_memory_bytes"] / (1 - HEADROOM)) + 1
    return BudgetError(
        f"COLAUTO_MEMORY_BUDGET (or options['memory_budget']): {fmt_bytes(budget)} is below the smallest peak "
        f"colauto found, {fmt_bytes(least['peak_memory_bytes'])} (parameters + gradients + optimizer state "
        f"{fmt_bytes(persistent)}, activations and temporaries "
        f"{fmt_bytes(least['peak_memory_bytes'] - persistent)}) plus {HEADROOM:.1%} headroom; set it to at least "
        f"{fmt_bytes(needed, up=True)}, or shrink the batch", needed)


def remat_frontier(joint: fx.GraphModule, baseline: Analysis, base: dict,
                   buffers: frozenset[str] = frozenset()) -> tuple[solver.Frontier, list[fx.Node], float]:
    """The DP's Pareto frontier of (memory units kept for backward, recompute seconds), the nodes in
    solver order, and the bytes per memory unit. `base` is `baseline.evaluate(baseline.hints)`."""
    frontier, nodes, quantum, _ = _solve(joint, baseline, base, buffers)
    return frontier, nodes, quantum


def _solve(joint: fx.GraphModule, baseline: Analysis, base: dict, buffers: frozenset[str],
           extern: bool = True) -> tuple[solver.Frontier, list[fx.Node], float, solver.RematProblem]:
    """`remat_frontier` and the problem it solved. Under Inductor, `extern`: a value an extern kernel
    reads in the backward costs its own kernel to recompute and nothing to keep
    (`Analysis.recompute_times`); without, every recomputed memory-bound value fuses into its reader."""
    times = graph.node_times(baseline.costs, base["_recompute_times"])
    keep_time: dict[str, float] = {}
    if baseline.fused:   # under Inductor, keeping a fusible intermediate costs writing it in forward
        bw = baseline.device.bandwidth   # and reading it back in backward; neither where an extern kernel
        fwd, bwd = baseline.extern_read if extern else ((), ())   # reads it there (a buffer there anyway)
        keep_time = {c.name: ((c.name not in fwd) + (c.name not in bwd)) * graph.value_at(c.written, baseline.hints) / bw
                     for c in baseline.costs.nodes if c.kind == "memory"}
        if not extern:
            alone = baseline.costs.node_times(base["_values"], baseline.device)
            times = graph.node_times(baseline.costs, baseline.recompute_times(
                base["_values"], base["_node_times"], alone, extern=False))
    # Op by op (aten), a tensor the backward first reads at or before the step's peak is live at the
    # peak whether it is kept or recomputed: recomputing it costs time and saves nothing, so it is
    # pinned. Under Inductor a recomputed memory-bound op fuses into its reader and never exists.
    phase, _, at = base["peak_at"].partition(":")
    pinned = (graph.read_by_backward_before(joint.graph, at) if phase == "bwd" and not baseline.fused
              else frozenset())
    problem, nodes, quantum = graph.remat_problem(joint.graph, times, baseline.hints, pinned=pinned,
                                                  buffers=buffers, keep_time=keep_time)
    frontier = solver.solve(problem, max_states=MAX_DP_STATES)
    if frontier.pruned_steps:
        DP_PRUNED[f"more than {MAX_DP_STATES} states"] += 1
    return frontier, nodes, quantum, problem


def _tags(choices: tuple[int, ...], nodes: list, only: set[str] | None,
          fixed: list[bool]) -> tuple[bool | None, ...]:
    """Tags for min-cut: keep/recompute where the DP kept or recomputed a node (of `only`, if given);
    keep (never recompute) where the node may not be recomputed; None (min-cut decides) elsewhere."""
    return tuple(True if f else c == solver.KEEP if c != solver.SKIP and (only is None or n.name in only) else None
                 for n, c, f in zip(nodes, choices, fixed))


def first_fitting(order: list, fits: Callable[[Any], bool]) -> Any:
    """The first of `order` (candidates, fastest first) that `fits`, found in about 2 sqrt(n) calls of
    `fits` (each modeled peak is a liveness replay of the whole step: 46 of them took 6.4 s of 13.5 s on HF
    Llama 1.1B under a budget, one H200), not n: every k-th candidate (k = ceil(sqrt(n)), the first and
    the last included) is tried in order, and where the first of them fits, the ones between it and the previous
    tried are tried in order too. Exact where whether a candidate fits changes once along `order` (the
    peak falls as recomputation grows); where it does not, a candidate between two tried ones that do
    not fit is passed over. Monotone all the same for a given `order`: the tried candidates do not
    depend on what fits, and where more fits the first fitting one is no later."""
    n = len(order)
    step = max(1, math.isqrt(n - 1) + 1) if n else 1
    tried = [*range(0, n, step)]          # the fastest first: where nothing needs recomputing, one call
    if n and tried[-1] != n - 1:
        tried.append(n - 1)
    prev = -1
    for i in tried:
        if fits(order[i]):
            return next((order[j] for j in range(prev + 1, i) if fits(order[j])), order[i])
        prev = i
    return None


def spread_points(n_points: int, most: int = MAX_CANDIDATES) -> list[int]:
    """Frontier points considered, fastest first: all, or `most` spread evenly. The set does not depend
    on the budget, which is what makes the choice monotone in the budget."""
    if n_points <= most:
        return list(range(n_points - 1, -1, -1))
    picks = {round(i * (n_points - 1) / (most - 1)) for i in range(most)}
    return sorted(picks, reverse=True)


def _describe(budget, base: dict, ev: dict, analysis: Analysis, frontier: solver.Frontier | None, simulated: int,
              quantum: float, solve_s: float, start: float) -> Plan:
    by_layer: dict[str, list[str]] = {}
    for c in analysis.costs.nodes:
        if c.name in analysis.recomputed and c.kind != "view":
            by_layer.setdefault(layer_of(c.module), []).append(c.op.replace("aten.", "").split(".")[0])
    return Plan(budget_bytes=budget, peak_without_bytes=base["peak_memory_bytes"],
                peak_with_bytes=ev["peak_memory_bytes"], saved_without_bytes=base["saved_activation_bytes"],
                saved_with_bytes=ev["saved_activation_bytes"], recompute_time_s=ev["est_recompute_time_s"],
                step_time_without_s=base["est_step_time_s"], step_time_with_s=ev["est_step_time_s"],
                recomputed=by_layer, frontier_points=0 if frontier is None else len(frontier.memory),
                simulated_plans=simulated, quantum_bytes=quantum, solve_s=solve_s, plan_s=time.perf_counter() - start,
                dp_pruned_steps=0 if frontier is None else frontier.pruned_steps)


def recomputed_in(bw: fx.GraphModule, joint: fx.GraphModule) -> frozenset[str]:
    """Forward nodes that the backward graph runs again (same names as in the joint graph)."""
    forward = {n.name for n in joint.graph.nodes if n.op == "call_function" and not graph.is_backward(n)}
    return frozenset(n.name for n in bw.graph.nodes if n.op == "call_function" and n.name in forward)

