"""A memory budget held across the graphs of a training step that Dynamo split at graph breaks.

Dynamo compiles a step with a graph break as several graphs, compiled as they are first reached: their
forwards run in order and their backwards in reverse. While graph k runs, forward and backward, the graphs
before it hold what their forwards saved for their backwards, and their parameters with their optimizer
state; graph k's memory model counts its own inputs and parameters only. Before 2026-12-07 each graph was
planned under the whole budget: HF OPT (transformers 5.17) peaked at 23.5 GiB under a 19.1 GiB budget on an
H100 (bench/results/h100-2026-12-07-first-step-last-four/).

Measured, not modelled: each forward compiled under a budget the user set, where Dynamo had recorded a graph
break, records weak references to the storages it saves for its backward and returns, not its inputs'
(`Graph.tracked`); its backward releases them (`Graph.released`), and an autograd graph dropped without a
backward frees them. A later graph is planned under the budget less what the earlier runs still hold
(`held_outside`: their storages, and their parameters with their optimizer state).

The earlier graphs were planned before the later ones were seen, so they may leave too little: a later
graph whose least plan does not fit runs that least plan, the step's first run goes over the budget (warned,
counted in SHORT), and the earlier graphs are planned again, each under its own peak less its share of the
shortfall (by what its runs hold: `make_room`), recompiled at their next call (`Graph.__call__`, with that
call's inputs); the later graph is then planned again under what they leave. Likewise where what the later
graphs returned or took (the logits the script holds, made by a later graph or by eager code between the
graphs: Dynamo 2.11 runs an output embedding whose hook breaks the graph outside any graph) is alive through
an earlier graph's backward (`Graph._after_others`). The caps are kept (`plan_cache`, `caps/`), so a later launch plans the earlier
graphs under them at once. Where Dynamo splits the step inside a layer the model repeats, one graph runs for
every layer: warned once (RERUN), and its share divided among its runs. Graphs of symbolic sizes are
tracked but not planned again; where even the least plans cannot leave the room, the step runs over the
budget, warned (`warn_unheld`).
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable

import torch

from . import _torch_compat as compat
from . import counters, plan_cache, report
from .cost import memory

SHARED = counters.counter("graphs planned under the budget less what earlier graphs of the step hold")
SHORT = counters.counter("graphs of a split step whose least plan did not fit what the earlier graphs left")
REPLANNED = counters.counter("graphs of a split step planned again at their next call")
UNHELD = counters.counter("graphs of a split step that cannot leave the room the step's other graphs need")
RERUN = counters.counter("compiled graphs run again in one step while their earlier run's saved tensors are alive")
MAX_REPLANS = 2   # plans of one graph after its first (each is a compile)


@dataclasses.dataclass
class _Forward:
    """One run of a tracked forward whose backward has not released what it saved."""
    saved: list[tuple[Any, int]]          # (weak reference to a storage, its bytes)
    params: list[weakref.ref]             # the parameters this run took (each layer's, for a graph run per layer)
    graph: "weakref.ref[Graph]"
    taken: set[int]                       # the storages it took as inputs (its own to count)
    # what it took, parameters aside (weak references, bytes): an earlier graph's outputs (counted once with
    # that run's), and what no graph made: eager code's outputs between the graphs (the logits of an output
    # embedding Dynamo ran outside them), an inference graph's (a mask), the script's (the batch); alive
    # while the script or a later run holds them, through the earlier graphs' backwards
    took: list[tuple[Any, int]] = dataclasses.field(default_factory=list)


_PENDING: list[_Forward] = []    # forwards run, oldest first; pruned as their storages die
# the parameters every run of this step took, and those eager code before a run used (id -> weak reference):
# all of them and their optimizer state are alive through each backward, with the gradients the backwards
# before it made
_STEP_PARAMS: dict[int, weakref.ref] = {}
_WALKED: set[int] = set()    # the autograd nodes `_params_upstream` walked this step (ids; alive through it)
# what the backwards that ran left alive (outputs the script holds: the logits), alive through the backwards
# of the graphs before theirs: (weak reference to a storage, its bytes, the graph)
_AFTER: list[tuple[Any, int, "weakref.ref[Graph]"]] = []


@dataclasses.dataclass(frozen=True)
class Held:
    """What earlier graphs of the step hold while a later one runs."""
    saved_bytes: int = 0         # storages their forwards saved for their backwards, still alive
    param_bytes: int = 0         # their parameters (and optimizer state) that this graph does not take
    graphs: tuple["Graph", ...] = ()   # the graphs whose runs hold them, oldest first
    runs: tuple[int, ...] = ()         # how many runs of each (a graph run for each layer: several)

    @property
    def nbytes(self) -> int:
        return self.saved_bytes + self.param_bytes


class Graph:
    """One compiled graph of a split step: the callable Dynamo runs. `compile(inputs)` plans and compiles it
    under what the earlier graphs leave (backend._split_compile, which sets `fn`; None where it cannot be
    planned again: symbolic sizes).
    `cap`: the peak it is planned under at most, so that the step's later graphs fit (kept for later
    launches under `digest`)."""

    def __init__(self, compile: Callable[[list], None] | None, budget: int, digest: str,
                 optimizer: str = "adamw") -> None:
        self.compile, self.budget, self.digest, self.optimizer = compile, budget, digest, optimizer
        kept = (plan_cache.load(f"caps/{digest}") or {}).get("bytes")
        self.cap: int | None = kept if isinstance(kept, int) else None
        self.analysis: Any = None     # its plan's analysis (backend.ANALYSES holds the graphs that run)
        self._peak: tuple[Any, int] = (None, 0)   # (analysis, its peak): `peak`
        self.planned_under = budget   # the budget it was last to be planned under
        self.fn: Callable | None = None
        self.stale = False            # plan again at the next call
        self.replans = 0
        self.warned_rerun = self.warned_unheld = False
        self.last_held = 0            # bytes its latest run holds

    def __call__(self, *args: Any) -> Any:
        if self.stale:
            self.stale = False
            if self.compile is not None and self.replans < MAX_REPLANS:
                self.replans += 1
                REPLANNED["planned again"] += 1
                with compat.compile_outside_dynamo():   # the backward compiled for the forward's output strides
                    self.compile(list(args))
            else:
                # its plan stays: over the budget only if what the earlier graphs now hold leaves too little (they
                # may have been planned again since: a later step's check, not the one that asked, decides)
                held = held_outside(list(args), self.optimizer, own=self)
                if self.peak + held.nbytes > self.budget:
                    warn_unheld(self, self.budget - held.nbytes)
        return self.fn(*args)

    @property
    def peak(self) -> int:
        """Its plan's peak: its compiled code's where Inductor generated it, else the memory model's. Kept
        per plan (reading the compiled code's replays its allocations; it is asked at every backward)."""
        if self.analysis is None:
            return 0
        if self._peak[0] is not self.analysis:
            compiled = self.analysis.compiled_peak()
            self._peak = (self.analysis, compiled[0] if compiled is not None else self.analysis.modelled_peak)
        return self._peak[1]

    def under(self, held: Held) -> int:
        """The budget it is planned under while the earlier graphs hold `held`."""
        return max(min(self.budget - held.nbytes, self.cap if self.cap is not None else self.budget), 0)

    def tracked(self, fn: Callable) -> Callable:
        """The compiled forward `fn` (AOTAutograd's), recording each run's output storages that are not its
        inputs' (parameters, the batch, an earlier graph's outputs): what it saves for its backward, and what
        it returns (held by Dynamo's frame between the graphs, or taken by the later graphs, which count their
        own inputs). A run that starts while an earlier run of this graph still holds what it saved (one
        graph for each layer of a repeated stack) is warned about once. Boxed calling convention
        (AOTAutograd calls it with one list)."""
        boxed = getattr(fn, "_boxed_call", False)
        me = weakref.ref(self)

        def run(args: list) -> Any:
            if not self.warned_rerun:
                earlier = [f for f in _PENDING if f.graph() is self and _alive(f)]
                if earlier:
                    self.warned_rerun = True
                    RERUN["warned"] += 1
                    held = sum(n for f in earlier for ref, n in f.saved if not ref.expired())
                    report.warn_once(
                        f"colauto: a compiled graph runs again in one training step while {len(earlier)} earlier "
                        f"run(s) of it hold {report.fmt_bytes(held)} saved for their backward (Dynamo split the step "
                        "inside a layer the model repeats, so one graph runs for each layer); it was planned for its "
                        "first run, so the step can go over the memory budget "
                        f"{report.fmt_bytes(self.budget)} until it is planned again for all of them; remove the graph "
                        "break (torch._dynamo.explain(model)(...) shows where)")
            # each run's own: a graph run for each layer takes each layer's parameters
            params = [a for a in args if isinstance(a, torch.nn.Parameter)]
            param_storages = {compat.storage_key(a) for a in params}
            # what it takes is another's: the script's (the batch), the model's, or an earlier graph's outputs
            took = {compat.storage_key(a): a for a in args if isinstance(a, torch.Tensor)
                    and not isinstance(a, torch.nn.Parameter) and not compat.is_fake(a)}
            taken = set(took)
            _PENDING[:] = [f for f in _PENDING if _alive(f)]
            if not _PENDING:    # the first graph of a step: what the last step's backwards left is not this one's
                _AFTER.clear()
                _STEP_PARAMS.clear()
                _WALKED.clear()
            _STEP_PARAMS.update((id(p), weakref.ref(p)) for p in [*params, *_params_upstream(took.values())])
            out = fn(args) if boxed else fn(*args)
            saved, seen = [], param_storages | taken
            for t in out:   # what it saved, and its outputs (held by Dynamo's frame or the later graphs)
                if isinstance(t, torch.Tensor) and not compat.is_fake(t):
                    key = compat.storage_key(t)
                    if key not in seen:
                        seen.add(key)
                        saved.append((compat.storage_weak_ref(t), compat.storage_nbytes(t)))
            self.last_held = sum(n for _, n in saved)
            _PENDING.append(_Forward(saved, [weakref.ref(p) for p in params], me, taken,
                                     [(compat.storage_weak_ref(a), compat.storage_nbytes(a)) for a in took.values()]))
            return out
        run._boxed_call = True   # type: ignore[attr-defined]
        return run

    def released(self, fn: Callable) -> Callable:
        """The compiled backward `fn`: as it runs, the latest pending run of this graph no longer counts (the
        backward reads and frees what it saved; a storage that outlives it, a buffer or an output the script
        holds, is not the step's)."""
        boxed = getattr(fn, "_boxed_call", False)

        def run(args: list) -> Any:
            taken: set[int] = set()
            own: set[int] = set()
            for i in range(len(_PENDING) - 1, -1, -1):
                if _PENDING[i].graph() is self:
                    _AFTER.extend((ref, n, _PENDING[i].graph) for ref, n in [*_PENDING[i].saved, *_PENDING[i].took]
                                  if not ref.expired())
                    taken = _PENDING[i].taken
                    own = {id(p) for p in (ref() for ref in _PENDING[i].params) if p is not None}
                    del _PENDING[i]
                    break
            self._after_others(args, taken, own)
            return fn(args) if boxed else fn(*args)
        run._boxed_call = True   # type: ignore[attr-defined]
        return run

    def _after_others(self, args: list, taken: set[int], own: set[int]) -> None:
        """As its backward starts: what the later graphs' runs left alive (the script's outputs), the runs
        still pending (earlier runs of this graph, for each layer), and the parameters the step's other runs
        took (`own`: this run's, ids), with their optimizer state and the gradients the backwards before it
        made, are live through it, which its plan did not count. Where that takes it over the budget, it is
        planned again at its next call under its peak less the excess, divided among its runs (kept), else
        warned (`warn_unheld`)."""
        _AFTER[:] = [a for a in _AFTER if not a[0].expired()]
        # its own: what the backward takes, and what its forward took (its plan counted both)
        inputs = {compat.storage_key(t) for t in args if isinstance(t, torch.Tensor)} | taken
        seen, after = set(inputs), 0
        for ref, n, graph in _AFTER:
            if graph() is not self and ref.cdata not in seen:
                seen.add(ref.cdata)
                after += n
        # what the runs still pending hold (the earlier graphs', and earlier runs of this one)
        live = [f for f in _PENDING if _alive(f)]
        pending = _storage_bytes(live, seen)
        beside = _params_beside(own, self.optimizer)
        excess = self.peak + pending + beside + after - self.budget
        if excess <= 0 or self.analysis is None or self.stale:   # stale: planned again already
            return
        runs = 1 + sum(1 for f in live if f.graph() is self)   # each of its runs then saves less
        cap = self.peak - -(-excess // runs)
        if self.compile is not None and self.replans < MAX_REPLANS and (self.cap is None or cap < self.cap):
            self.cap, self.stale = cap, True
            plan_cache.store(f"caps/{self.digest}", {"bytes": cap})
            SHORT["an earlier graph's backward ran beside what the step's other runs hold"] += 1
            report.warn_once(
                f"colauto: the memory budget {report.fmt_bytes(self.budget)} is not held by this step's first run: "
                f"Dynamo split it at a graph break, and through an earlier graph's backward the step's other runs hold "
                f"{report.fmt_bytes(pending + after)} (still pending {report.fmt_bytes(pending)}, what the later graphs "
                f"returned or took, which the script holds {report.fmt_bytes(after)}); that graph is planned again under "
                f"{report.fmt_bytes(cap)} from the next step on (kept for later launches); remove the graph break to "
                "plan the step as one graph")
            return
        warn_unheld(self, self.peak - excess)


def warn_unheld(graph: Graph, least: int) -> None:
    """A graph of a split step could not be planned under `least` to leave the room the step needs: its step
    goes over the budget by about what its plan holds above that (warned once a graph, counted in UNHELD)."""
    if graph.warned_unheld:
        return
    graph.warned_unheld = True
    UNHELD["warned"] += 1
    report.warn_once(
        f"colauto: the memory budget {report.fmt_bytes(graph.budget)} is not held: Dynamo split the step at a "
        f"graph break, and one of its graphs cannot be planned under {report.fmt_bytes(max(least, 0))} to leave "
        "what the step's other graphs hold while it runs (its plan stays; the step goes over by about "
        f"{report.fmt_bytes(max(graph.peak - least, 0))}); remove the graph break, or raise the budget by that much")


def reset() -> None:
    """Forget every forward run recorded, as a new process starts (tests/conftest.py, before each test)."""
    _PENDING.clear()
    _AFTER.clear()
    _STEP_PARAMS.clear()
    _WALKED.clear()


def _params_upstream(tensors) -> list[torch.nn.Parameter]:
    """The parameters the autograd graph of `tensors` (a run's inputs) reaches that this step has not walked
    to yet: those eager code between the graphs used (Dynamo runs a frame with a graph break in its loop
    eagerly: HF Llama broken in its first layer runs its embedding outside any graph), which no graph takes."""
    stack = [t.grad_fn for t in tensors if t.grad_fn is not None]
    found = []
    while stack:
        node = stack.pop()
        if node is None or id(node) in _WALKED:
            continue
        _WALKED.add(id(node))
        leaf = getattr(node, "variable", None)    # AccumulateGrad: a leaf that requires grad
        if isinstance(leaf, torch.nn.Parameter):
            found.append(leaf)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found


def _params_beside(own: set[int], optimizer: str) -> int:
    """Bytes of the parameters the step's runs took but `own` (ids: a run's own, which its plan counts),
    with their optimizer state, and their gradients where the backwards before have made them (before
    2026-12-08 only the parameters of the graphs pending at its compile counted: HF OPT under transformers
    5.17, one graph for each of its 24 layers, peaked at 23.48 GiB on an H100 under a 19.1 GiB budget with
    the other layers' parameters, state and gradients, about 13 GiB, counted nowhere, and nothing planned)."""
    total, states = 0, memory.optimizer_states(optimizer)
    for key, ref in list(_STEP_PARAMS.items()):
        p = ref()
        if p is None:
            del _STEP_PARAMS[key]
            continue
        if key in own:
            continue
        nbytes = compat.storage_nbytes(p)
        total += nbytes * (1 + states if p.requires_grad else 1)
        if p.grad is not None:
            total += compat.storage_nbytes(p.grad)
    return total


def _storage_bytes(runs: list[_Forward], seen: set[int]) -> int:
    """Bytes of the live storages `runs` recorded, what they saved and returned and what they took that no
    graph made (eager code's outputs between the graphs: an embedding Dynamo ran outside them, a mask an
    inference graph made), each once, none of `seen` (which gets them)."""
    total = 0
    for forward in runs:
        for ref, nbytes in [*forward.saved, *forward.took]:
            if not ref.expired() and ref.cdata not in seen:
                seen.add(ref.cdata)
                total += nbytes
    return total


def _alive(forward: _Forward) -> bool:
    return forward.graph() is not None and any(not ref.expired() for ref, _ in forward.saved)


def held_outside(example_inputs: list, optimizer: str = "adamw", own: Graph | None = None) -> Held:
    """What the forwards run before this graph's compile (or call) still hold, less what this graph takes as
    inputs, and less the runs of `own` (this graph); the parameters this step used so far but its own, with
    their optimizer state (`_params_beside`)."""
    live = [f for f in _PENDING if _alive(f) and f.graph() is not own]
    if not live:
        return Held()
    inputs = {compat.storage_key(t) for t in example_inputs
              if isinstance(t, torch.Tensor) and not compat.is_fake(t)}
    mine = {id(t) for t in example_inputs if isinstance(t, torch.nn.Parameter)}
    saved = _storage_bytes(live, set(inputs))
    _STEP_PARAMS.update((id(p), weakref.ref(p)) for p in _params_upstream(
        t for t in example_inputs if isinstance(t, torch.Tensor) and not compat.is_fake(t)))
    params = _params_beside(mine, optimizer)
    runs: dict[Graph, int] = {}
    for f in live:
        g = f.graph()
        if g is not None:
            runs[g] = runs.get(g, 0) + 1
    return Held(saved, params, tuple(runs), tuple(runs.values()))


def make_room(held: Held, short: int) -> list[Graph]:
    """The earlier graphs `held` names leave `short` bytes more free, shared by what they hold: each is
    planned again at its next call under its plan's peak less its share (what it saves is all live at its
    forward's end, so a lower peak saves less), and that cap is kept for later launches. The graphs that
    will be planned again."""
    weights = [g.last_held * n for g, n in zip(held.graphs, held.runs)]
    total = sum(weights) or 1
    replanned = []
    for g, n, weight in zip(held.graphs, held.runs, weights):
        share = -(-short * weight // (total * n))   # each of its n runs saves that much less
        # against its plan's peak; the requests of one step are not summed (each later graph counts all of
        # what this one saves): the least cap asked for before it is planned again
        g.cap = min(g.peak - share, g.cap if g.stale and g.cap is not None else g.peak)
        plan_cache.store(f"caps/{g.digest}", {"bytes": g.cap})
        if g.compile is not None and g.replans < MAX_REPLANS:
            g.stale = True
            replanned.append(g)
    return replanned
