"""The Dynamo entry point: `torch.compile(model, backend="colauto")`.

Wires AOTAutograd: our partition_fn sees the joint forward+backward graph, builds the symbolic cost
model on it, partitions it, and hands the halves to the chosen code generation. Nothing else lives here.
"""
from __future__ import annotations

import collections
import copy
import contextlib
import dataclasses
import functools
from typing import Any, Callable, Sequence

import torch

from . import _torch_compat as compat
from . import config as cfg
from . import chunked_loss, counters, cuda_graphs, expand_layers, output_grads, plan_cache, planner, report, split_step
from .emit import remat as emit_remat
from .analysis import Analysis, analyze
from .cost import memory
from .cost.device import resolve
from .parallel import data, mesh, overlap
from .parallel import entry as parallel_entry

# The latest analyses the backend made, newest last (for tests and debugging; bounded: each holds a graph).
ANALYSES: collections.deque[Analysis] = counters.records("analyses")
# graphs whose compiled step came from torch's AOTAutograd cache (planned in an earlier launch), by codegen
CACHE_HITS = counters.counter("compile cache hits")
# codegen triton: graphs whose rest (what the generated kernels leave) Inductor compiled, by kind
REST_BY_INDUCTOR = counters.counter("triton graphs with Inductor for the rest")


def colauto(gm: torch.fx.GraphModule, example_inputs: list, **kwargs: Any) -> Callable:
    """torch.compile backend. `options=` keys override the COLAUTO_* environment (see config.py)."""
    config = cfg.load(kwargs.get("options"))
    return make_backend(config)(gm, example_inputs)


def make_backend(config: cfg.Config, on_analysis: Callable[[Analysis], None] | None = None) -> Callable:
    """A backend closure for one Config. `on_analysis` is told each analysis (profile() uses it).
    On several ranks the distributed path plans and shards first, then compiles local graphs. The
    garbage collector is paused while it runs (`planner.gc_paused`): tracing, planning and Inductor's
    compile fill the heap with graphs and fake tensors that each full collection would scan."""
    @planner.gc_paused
    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        resolved = cfg.resolve_codegen(config, example_inputs)
        if parallel_entry.active(resolved):
            def make_local(dp=None, memory_budget=None, decide=None):
                planned = config if memory_budget is None else dataclasses.replace(config, memory_budget=memory_budget)
                return local_backend(planned, on_analysis, dp=dp, decide=decide)
            return parallel_entry.compile(gm, example_inputs, resolved, make_local)
        graph = _split_graph(config, resolved, gm, example_inputs, on_analysis)
        if graph is None:
            return _held_to_budget(config, on_analysis, gm, example_inputs)
        _split_compile(graph, config, resolved, gm, example_inputs)
        return graph
    return backend


def _user_budget(config: cfg.Config) -> bool:
    return config.memory_budget is not None and config.memory_budget[0] != "none"


def _split_graph(config: cfg.Config, resolved: cfg.Config, gm: torch.fx.GraphModule, example_inputs: list,
                 on_analysis: Callable[[Analysis], None] | None) -> split_step.Graph | None:
    """Where this graph may be one of several Dynamo split a training step into (a graph break recorded)
    under a budget the user set, in one process: the `split_step.Graph` it is compiled as, else None."""
    first = next((t for t in example_inputs if isinstance(t, torch.Tensor)), None)
    training = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs)
    if not (_user_budget(config) and training and on_analysis is None and first is not None and report.graph_breaks()):
        return None
    device = resolve(resolved.device, first)
    budget = planner.resolve_budget(config.memory_budget, device.memory_bytes)
    # planned again at a later call with that call's inputs: static sizes, Dynamo's plain calling convention
    static = not isinstance(gm, torch._dynamo.utils.GmWrapper) and all(
        isinstance(s, int) for t in example_inputs if isinstance(t, torch.Tensor) for s in t.shape) and all(
        isinstance(t, torch.Tensor) for t in example_inputs)
    digest = plan_cache.margin_key(gm, example_inputs, ("split step", config.memory_budget, resolved.codegen,
                                                        repr(device), config.optimizer))
    graph = split_step.Graph(None, budget, digest, config.optimizer)
    if static:
        graph.compile = lambda inputs: _split_compile(graph, config, resolved, gm, inputs)
    return graph


def _split_compile(graph: split_step.Graph, config: cfg.Config, resolved: cfg.Config, gm: torch.fx.GraphModule,
                   example_inputs: list) -> None:
    """Compile one graph of a split step (`split_step`; sets `graph.fn`) under the budget less what the
    step's earlier graphs hold as it is compiled (counted, reported), and under its cap (room for its later
    graphs). Where even its least plan does not fit, it runs that plan, this step goes over the budget
    (warned, counted), and the earlier graphs are planned again leaving the room at their next call
    (`split_step.make_room`), then this one under what they leave; where they have been planned again as
    often as they may be, its least plan runs, warned; where they never can be (symbolic sizes), a
    BudgetError names the budget the step needs."""
    held = split_step.held_outside(example_inputs, config.optimizer, own=graph)
    under = graph.under(held)
    before = graph.analysis           # planned again: the plan it replaces no longer runs, if this one does
    if before is not None:
        _forget(before)
    graph.planned_under = under
    if held.nbytes or graph.cap is not None:
        split_step.SHARED["planned under the rest of the budget"] += 1
        report.emit_shared_budget({"budget_bytes": graph.budget, "saved_bytes": held.saved_bytes,
                                   "param_bytes": held.param_bytes, "graphs": len(held.graphs),
                                   "under_bytes": under}, resolved.report)

    def compile_under(nbytes: int) -> None:
        graph.fn = _held_to_budget(dataclasses.replace(config, memory_budget=("bytes", float(nbytes))), None,
                                   gm, example_inputs, step_graph=graph)
        graph.analysis = ANALYSES[-1]   # the plan that runs (a looser attempt dropped, the held one restored)
    try:
        compile_under(under)
        return
    except planner.BudgetError as error:
        room = graph.budget - held.nbytes
        if graph.cap is not None and graph.cap < room:
            # its cap (room for the later graphs) is under what its plans reach: its least plan where that
            # fits, else, planned again, the plan it ran (warned: the step goes over the budget)
            graph.cap = max(graph.cap, error.smallest_bytes)
            plan_cache.store(f"caps/{graph.digest}", {"bytes": graph.cap})
            try:
                if graph.cap <= room:
                    compile_under(graph.cap)
                    return
            except planner.BudgetError:
                pass
            if before is not None:
                ANALYSES.append(before)
                graph.analysis = before
                split_step.warn_unheld(graph, under)
                return
            compile_under(room)
            return
        if not held.nbytes:
            raise
        short = error.smallest_bytes - under
        if not split_step.make_room(held, short):
            if not any(g.compile is not None for g in held.graphs):   # symbolic sizes: never planned again
                raise _unshared(graph.budget, held, error) from None
            # planned again as often as they may be: its least plan runs, over the budget (warned)
            compile_under(error.smallest_bytes)
            split_step.warn_unheld(graph, under)
            return
        split_step.SHORT["ran its least plan; the earlier graphs planned again"] += 1
        report.warn_once(
            f"colauto: the memory budget {report.fmt_bytes(graph.budget)} is not held by this step's first run: "
            f"Dynamo split it at a graph break, the graphs before this one hold {report.fmt_bytes(held.nbytes)} "
            f"while it runs and its least plan needs {report.fmt_bytes(error.smallest_bytes)} "
            f"({report.fmt_bytes(short)} over); they are planned again to leave that free from the next step on "
            "(kept for later launches); remove the graph break to plan the step as one graph")
        try:
            compile_under(error.smallest_bytes)
        except planner.BudgetError as again:
            raise _unshared(graph.budget, held, again) from None
        graph.stale = True   # planned again at its next call, under what the earlier graphs then leave


def _unshared(budget: int, held: split_step.Held, error: planner.BudgetError) -> planner.BudgetError:
    """No plan of a later graph of a split step fits what the earlier graphs leave of the budget, and they
    cannot be planned again: one line naming what they hold and a budget that holds the step with them."""
    fmt = report.fmt_bytes
    needed = error.smallest_bytes + held.nbytes
    return planner.BudgetError(
        f"COLAUTO_MEMORY_BUDGET (or options['memory_budget']): {fmt(budget)} cannot be held across the graphs "
        f"Dynamo split the step into at a graph break: the graphs before this one hold {fmt(held.nbytes)} while it "
        f"runs (saved for their backward {fmt(held.saved_bytes)}, parameters and optimizer state "
        f"{fmt(held.param_bytes)}) and its least plan needs {fmt(error.smallest_bytes)}; set it to at least "
        f"{fmt(needed, up=True)}, or remove the graph break (torch._dynamo.explain(model)(...) shows where)", needed)


REPLANNED = counters.counter("steps planned again: the compiled code's peak was over the budget")
ATTEMPTS = 4   # compiles of one step at most, the first included (a backward compiled again under auto rules:
               # `_codegen`, not counted)
FUSION_REFUSED_AGAIN = counters.counter(
    "backwards compiled again refusing horizontal fusions of recomputation: the compiled code's peak was over the budget")


def _held_to_budget(config: cfg.Config, on_analysis: Callable[[Analysis], None] | None,
                    gm: torch.fx.GraphModule, example_inputs: list, step_graph: split_step.Graph | None = None) -> Callable:
    """The single-device compile of one graph (`local_backend`, which resolves the codegen and reports
    "(auto)"), held to a budget the user set by the compiled code's peak. Where Inductor generates both
    graphs of a training step, the backward is compiled with the forward (`compat.backward_compiled_now`),
    so the peak of the code Inductor generated (`Analysis.compiled_peak`, the step as the memory model
    assumes it: outputs held to the optimizer step) is known before the step runs. A step found over
    the budget is planned and compiled again under the budget less the model's error on it (compiled
    less modelled peak; up to ATTEMPTS compiles in all), counted (REPLANNED) and reported. The margin
    is kept (`plan_cache.store_margin`): a later launch plans under it at once, its caches (plan,
    compiled step) keyed by that budget. Under auto planned rules (the default) the step is compiled
    letting Inductor fuse recomputed ops horizontally; a backward that takes the step over the budget so
    is compiled again refusing that (`_codegen`, counted in FUSION_REFUSED_AGAIN) before any re-plan,
    and the rules are kept for later launches.
    The other way: a step whose compiled code leaves LOOSER_ROOM of the budget or more unused where the
    memory model put it higher is planned and compiled again under more of the budget (`_looser_margin`,
    where the planner expects that plan LOOSER_GAIN faster, else counted in LOOSER_SKIPPED and reported;
    at most LOOSER_COMPILES times, counted in LOOSENED), so it recomputes less; a looser step over the
    budget is dropped for the plan that held (LOOSER_OVER). Once searched, the margin is kept as settled:
    a later launch plans under it at once and searches no more. A budget at most LEAST_ROOM under the
    least peak the model plans compiles that least plan, which runs where its code holds the budget
    (LEAST_COMPILED; else a BudgetError naming the least budget that code holds, `_least_compiled`). A
    plan chosen on the compiled figure alone keeps COMPILED_SLACK of the budget free.
    The memory model the plan is chosen by misses what Inductor's scheduling adds: HF Mistral under
    codegen triton ran 77 MiB over a 14.5 GiB budget on an H100, with the compiled figure exact
    (bench/results/h100-2026-12-06-triton-recompute/); on CPU, HF BART under codegen inductor 4% over."""
    resolved = cfg.resolve_codegen(config, example_inputs)
    first = next((t for t in example_inputs if isinstance(t, torch.Tensor)), None)
    training = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs)
    generated = resolved.codegen == "inductor" or (resolved.codegen == "triton" and rest_by_inductor(example_inputs))
    if not (_user_budget(config) and training and generated and first is not None and on_analysis is None):
        return local_backend(config, on_analysis, step_graph=step_graph)(gm, example_inputs)
    device = resolve(resolved.device, first)
    budget = planner.resolve_budget(config.memory_budget, device.memory_bytes)
    auto = config.planned_rules is None
    digest = plan_cache.margin_key(gm, example_inputs, (config.memory_budget, resolved.codegen, repr(device),
                                                       config.optimizer, ["auto"] if auto else sorted(config.planned_rules)))
    kept = plan_cache.load_margin(digest)
    margin = kept.nbytes
    # auto: Inductor's horizontal fusions of recomputed ops are allowed first (the `reuse` rule alone); a
    # backward whose step they take over the budget is compiled again refusing them (`_codegen`)
    rules = config.planned_rules if not auto else (kept.rules or frozenset({"reuse"}))
    # a looser plan is searched for once, by a launch that has not found its step over the budget
    search_looser = not kept.settled and margin <= 0
    held: _Held | None = None     # the loosest plan found to hold the budget, while a looser one is tried
    refused: planner.BudgetError | None = None   # the model's least plan over the budget, compiled to check
    loosened = 0                  # looser plans compiled
    for attempt in range(ATTEMPTS):
        # compiled_again_if_over: a step over the budget is not warned about where another compile (or the
        # held plan) replaces it
        under = dataclasses.replace(config, planned_rules=rules,
                                    compiled_again_if_over=attempt < ATTEMPTS - 1 or held is not None,
                                    fusion_rule_over=budget if auto and "fusion" not in rules else None)
        if margin:
            under = dataclasses.replace(under, memory_budget=("bytes", float(budget - margin)), held_budget=budget)
        planned: list[Analysis] = []
        try:
            with compat.backward_compiled_now():
                compiled = local_backend(under, on_analysis, planned_out=planned, step_graph=step_graph)(gm, example_inputs)
        except planner.BudgetError as error:
            if held is not None:    # no plan under the looser budget: cannot be (it is above a held one's)
                return held.restore(digest, rules if auto else None, resolved.report)
            if margin > 0:
                raise _unheld(budget, margin, error) from None
            if refused is not None or attempt == ATTEMPTS - 1 or error.smallest_bytes > (1 + LEAST_ROOM) * budget:
                raise
            # the memory model's least plan is a little over the budget: its compiled code may not be (the
            # model is high on recomputing steps), so it is compiled under the least budget and read
            refused, margin, search_looser = error, budget - error.smallest_bytes, False
            continue
        if planned and planned[0].recompiled_rules is not None:   # kept: a later launch compiles so at once
            rules = planned[0].recompiled_rules
            if plan_cache.store_margin(digest, margin, rules) is None:
                report.emit_rules_kept(sorted(rules), resolved.report)
        peak = planned[0].compiled_peak() if planned else None   # None: from torch's cache, or not generated
        if refused is not None:     # the least plan, compiled: it runs where its code holds the budget
            held_least = peak is not None and peak[0] <= (1 - COMPILED_SLACK) * budget
            LEAST_COMPILED["held the budget" if held_least else "over the budget, or unread"] += 1
            report.emit_loosened({"least_model_bytes": planned[0].modelled_peak
                                  if planned else None, "compiled_bytes": None if peak is None else peak[0],
                                  "budget_bytes": budget, "runs": held_least}, resolved.report)
            if not held_least:
                if planned:
                    _forget(planned[0])
                raise refused if peak is None else _least_compiled(budget, peak[0], refused)
            plan_cache.store_margin(digest, margin, rules if auto else None, settled=True)
            return compiled
        # a plan the model put over the budget (a looser one) runs on the compiled figure alone: with room
        if peak is not None and peak[0] <= (budget if held is None else (1 - COMPILED_SLACK) * budget):
            looser, gain = (_looser_margin(planned[0], peak[0], budget, margin)
                            if search_looser and attempt < ATTEMPTS - 1 and loosened < LOOSER_COMPILES else (None, None))
            if gain is not None:    # a looser plan, expected too little faster to compile the step again for
                LOOSER_SKIPPED[resolved.codegen] += 1
                report.emit_loosened({"compiled_bytes": peak[0], "budget_bytes": budget,
                                      "model_bytes": planned[0].modelled_peak, "gain": gain,
                                      "least_gain": LOOSER_GAIN}, resolved.report)
            if looser is None:
                # the search ran (a looser plan compiled, or a recomputing plan's planner asked): later
                # launches plan under its margin and search no more
                if held is not None or (search_looser and planned[0].recomputed):
                    plan_cache.store_margin(digest, margin, rules if auto else None, settled=True)
                return compiled
            held = _Held(compiled, planned[0], margin, peak[0])
            loosened += 1
            _forget(planned[0])
            LOOSENED[resolved.codegen] += 1
            report.emit_loosened({"compiled_bytes": peak[0], "budget_bytes": budget,
                                  "model_bytes": planned[0].modelled_peak,
                                  "planned_under_bytes": budget - looser}, resolved.report)
            margin = looser
            continue
        if held is not None:    # the looser plan's step is over the budget (or unread): the held plan is kept
            _forget(planned[0])
            return held.restore(digest, rules if auto else None, resolved.report, over=peak)
        if peak is None or attempt == ATTEMPTS - 1:
            return compiled
        _forget(planned[0])
        search_looser = False
        # the next plan's modelled peak must leave room for the model's error on this one (compiled less
        # modelled), which is about the same for the next: a plan under budget - margin may model well
        # below that, so the overshoot alone can leave the same plan (HF BART on CPU, 14 KiB over)
        modelled = planned[0].modelled_peak
        margin = max(margin + peak[0] - budget, peak[0] - modelled)
        REPLANNED[resolved.codegen] += 1
        stored = plan_cache.store_margin(digest, margin, rules if auto else None)
        report.emit_replanned({"compiled_bytes": peak[0], "budget_bytes": budget, "over_bytes": peak[0] - budget,
                               "planned_under_bytes": budget - margin, "kept": stored is None},
                              resolved.report)
    return compiled


# A plan whose compiled step peaks this fraction of the budget or more under it, where the memory model put it
# higher, is planned again under more of the budget (`_looser_margin`)
LOOSER_ROOM = 0.05
LOOSER_COMPILES = 2   # looser plans compiled at most (each is a compile of the step: first-step time)
LOOSENED = counters.counter("steps planned again under more of the budget: the compiled code's peak was well under it")
# ... only where the planner expects the looser plan's step at least this fraction faster than the one that
# held: compiling the step again doubles the first step (GPT-2 large and Qwen3-0.6B under a budget on one
# H100: 190 and 181 s against Inductor's 81 and 89 s), for about 1% of throughput where measured (HF Qwen2
# at 50% of its activations, 0.916x -> 0.925x Inductor) and none where the looser step went over the budget
LOOSER_GAIN = 0.02
LOOSER_SKIPPED = counters.counter(
    "looser plans not compiled: expected less than LOOSER_GAIN faster than the step that held the budget")
LOOSER_OVER = counters.counter("looser plans whose compiled step went over the budget: the plan that held was kept")
# A budget at most this fraction under the least peak the memory model plans is tried on that plan's compiled code
LEAST_ROOM = 0.30
# a plan chosen on the compiled code's figure alone (a looser plan, the least plan under such a budget) keeps this
# fraction of the budget free: the figure misses what an extern kernel allocates inside (CPU flash attention's
# backward: HF Qwen2 measured 12.80 MiB on the CPU allocator where the figure read 12.55)
COMPILED_SLACK = 0.025
LEAST_COMPILED = counters.counter("budgets under the memory model's least plan, that plan compiled and its code read")


def _forget(analysis: Analysis) -> None:
    """Drop a compiled attempt's analysis from ANALYSES (which holds the graphs that run)."""
    running = [a for a in ANALYSES if a is not analysis]
    ANALYSES.clear()
    ANALYSES.extend(running)


@dataclasses.dataclass
class _Held:
    """A compiled step that held the budget, kept while a looser plan is compiled (`_held_to_budget`)."""
    compiled: Callable
    analysis: Analysis
    margin: int
    peak: int

    def restore(self, digest: str, rules: frozenset[str] | None, setting: str | None,
                over: tuple[int, str] | None = None) -> Callable:
        """The held step runs after all: its analysis is the one that runs, and its margin is kept."""
        ANALYSES.append(self.analysis)
        LOOSER_OVER["over the budget" if over is not None else "no peak read, or no plan"] += 1
        plan_cache.store_margin(digest, self.margin, rules, settled=True)
        report.emit_loosened({"kept_bytes": self.peak, "looser_bytes": None if over is None else over[0]}, setting)
        return self.compiled


def _looser_margin(analysis: Analysis, peak: int, budget: int, margin: int) -> tuple[int | None, float | None]:
    """(the margin to plan under next, None) where the step's compiled peak leaves LOOSER_ROOM of the
    budget or more unused, the memory model put the plan's peak above the compiled one (its error on
    recomputation grows with how much is recomputed: HF Qwen2 on an H200 at half its activations, 13.57
    GiB modelled against 10.75 measured, with the compiled code's figure within 0.2% of the measured one
    where compared), and the planner, under half the model's error more or all of it (the first that makes
    it choose a plan it models higher; checked on the plan's own planner, without partitioning), expects
    that plan's step at least LOOSER_GAIN faster than this one's (the margin may be negative: more than the
    budget). (None, gain): that plan is expected only `gain` faster, under LOOSER_GAIN.
    (None, None): nothing recomputed, little room, the model not high, or no looser plan."""
    if not analysis.recomputed or analysis.planner is None or peak > (1 - LOOSER_ROOM) * budget:
        return None, None
    modelled = analysis.modelled_peak
    error = modelled - peak
    if error <= LOOSER_ROOM * budget / 2:
        return None, None
    held = analysis.plan.step_time_with_s if analysis.plan is not None else 0.0
    for step in (error // 2, error):
        try:
            preview = analysis.planner.plan(budget - (margin - step), partition=False)[0]
        except planner.BudgetError:
            return None, None
        if preview.peak_with_bytes > modelled * 1.001:
            # the first plan that changes is the one compiled, or none: a larger step's plan is likelier
            # over the budget (GPT-2 large on an H100, taking all of the model's error where half of it was
            # expected under 2% faster: over, so three compiles for the plan that held)
            gain = 1 - preview.step_time_with_s / held if held > 0 else 1.0
            return (margin - step, None) if gain >= LOOSER_GAIN else (None, gain)
    return None, None


def _least_compiled(budget: int, peak: int, error: "planner.BudgetError") -> "planner.BudgetError":
    """The budget is under the memory model's least plan, whose compiled code peaks over it (less
    COMPILED_SLACK). One line naming the least budget that plan holds: the model's least, where the code
    peaks at most that (it then plans the least plan and runs it), else the code's peak plus the slack (the
    model's least named there was refused again: HF MPT's code peaked 10.31 MiB, the model's least 9.67)."""
    held = int(peak / (1 - COMPILED_SLACK)) + 1
    needed = min(held, error.smallest_bytes) if peak <= error.smallest_bytes else held
    return planner.BudgetError(
        f"COLAUTO_MEMORY_BUDGET (or options['memory_budget']): {report.fmt_bytes(budget)} is below the least peak "
        f"colauto's plans reach: its least plan's compiled code peaks {report.fmt_bytes(peak)} (the memory model "
        f"plans {report.fmt_bytes(error.smallest_bytes)} with headroom), plus {COMPILED_SLACK:.1%} room; set it "
        f"to at least {report.fmt_bytes(needed, up=True)}, or shrink the batch", needed)


def _unheld(budget: int, margin: int, error: "planner.BudgetError") -> "planner.BudgetError":
    """The budget cannot be held: the memory model's plans that fit it compile to code that peaks over
    it, and no plan fits the room kept for the model's error (`margin`). One line, with the least
    budget that would work."""
    fmt_bytes = report.fmt_bytes
    return planner.BudgetError(
        f"COLAUTO_MEMORY_BUDGET (or options['memory_budget']): {fmt_bytes(budget)} cannot be held: the compiled "
        f"code peaks {fmt_bytes(margin)} above what the memory model plans, and no plan fits "
        f"{fmt_bytes(budget - margin)} (the smallest is {fmt_bytes(error.smallest_bytes)}); set it to at least "
        f"{fmt_bytes(error.smallest_bytes + margin, up=True)}, or shrink the batch", error.smallest_bytes + margin)


class _Stop(Exception):
    pass


def analyze_only(config: cfg.Config, gm: torch.fx.GraphModule, example_inputs: list,
                 grow: Grow | None = None) -> Analysis:
    """The unplanned single-device analysis of one graph: traced and costed, nothing compiled. `grow`: what
    AOTAutograd's joint graph becomes before it is costed (explain's layer expansion, parallel/entry.py)."""
    got: list[Analysis] = []

    def stop(analysis: Analysis) -> None:
        got.append(analysis)
        raise _Stop()
    # planning reads the aten graph: triton's rewrites (custom ops) are for the local SPMD graphs only
    quiet = dataclasses.replace(config, memory_budget=("none", 0.0), report=None,
                                codegen="aten" if config.codegen == "triton" else config.codegen)
    try:
        local_backend(quiet, stop, grow=grow)(gm, example_inputs)
    except _Stop:
        pass
    return got[0]


# What the distributed path decides from the unplanned analysis of a graph's capture (parallel/entry.py):
# the data-parallel group its gradients are averaged over (or None) and the budget it is compiled under.
Decide = Callable[[Analysis], "tuple[data.DataParallel | None, tuple[str, float]]"]
# (joint graph, its parameters' primal positions) -> the same of the graph costed instead (expand_layers.grow)
Grow = Callable[[torch.fx.GraphModule, list], "tuple[torch.fx.GraphModule, list]"]


def capture_serves_planning(config: cfg.Config, example_inputs: list) -> bool:
    """Whether `local_backend(config, decide=...)` can plan from the capture it compiles: a training graph
    (the parallel plan is for training), traced with the decompositions planning uses (`analyze_only`:
    triton's rewrites are planned as aten; where Inductor compiles triton's rest, the trace differs)."""
    config = cfg.resolve_codegen(config, example_inputs)
    needs_grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                                  for t in example_inputs)
    return needs_grad and not (config.codegen == "triton" and rest_by_inductor(example_inputs))


def local_backend(config: cfg.Config, on_analysis: Callable[[Analysis], None] | None = None,
                  dp: data.DataParallel | None = None, decide: Decide | None = None,
                  planned_out: list | None = None, step_graph: split_step.Graph | None = None,
                  grow: Grow | None = None) -> Callable:
    """The single-device backend: AOTAutograd with colauto's partitioner and code generation; with `dp`,
    each rank's graph averages its gradients (and losses) over the data-parallel ranks. With `decide`
    (`capture_serves_planning` must hold), `dp` and the budget are what `decide` makes of the joint graph's
    unplanned analysis, the one `analyze_only` would capture again: one capture plans and compiles.
    `planned_out`: gets the training graph's analysis once it is planned (its compiled peak is read
    from it once Inductor has generated both graphs). `grow`: see `analyze_only`."""
    unresolved = config

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        config = cfg.resolve_codegen(unresolved, example_inputs)
        owner = next((t for t in example_inputs if isinstance(t, torch.nn.Parameter)), None)  # stands for the model
        device = resolve(config.device, next((t for t in example_inputs if isinstance(t, torch.Tensor)), None))
        # codegen triton: whether Inductor compiles what the kernels leave; and with it, the memory model of
        # Inductor's fusion (Inductor codegen, and triton where Inductor compiles the rest)
        inductor_rest = config.codegen == "triton" and rest_by_inductor(example_inputs)
        inductor_fuses = config.codegen == "inductor" or inductor_rest
        layout = compat.input_layout(example_inputs)   # the closures below must not hold the inputs themselves
        chunk_loss = chunks_the_loss(config, example_inputs, dp is None and decide is None)
        # outputs returned beside the loss: their backward is compiled without their (zero) gradients
        unused = output_grads.decide(gm, "output_grads=all" if config.output_grads == "all" else
                                     "cuda graphs" if config.cudagraphs else None)
        marked = False
        planned: list[Analysis] = []   # the graph's published analysis, once partitioned (its plan, if any)

        def analyze_graph(joint, fw, bw, num_fwd_outputs, params) -> Analysis:
            env = compat.shape_env_of(joint.graph)
            analysis = analyze(joint, fw, bw, num_fwd_outputs=num_fwd_outputs, param_indices=params,
                               device=device, optimizer=config.optimizer, sources=compat.symbol_sources(env),
                               hints=compat.symbol_hints(env), fused=inductor_fuses)
            auto = " (auto)" if unresolved.codegen == "auto" else ""
            return dataclasses.replace(analysis, codegen=config.codegen + auto)

        def publish(analysis: Analysis, training: bool = True) -> None:
            ANALYSES.append(analysis)
            report.emit(analysis, config.report, owner)
            # a split step's training graphs share the budget where each is a step_graph (split_step); elsewhere
            # warned. An inference graph (HF OPT's mask) saves nothing: what it returns counts as a later graph's
            if training:
                report.warn_unshared_budget(_user_budget(config) and step_graph is None)
            if on_analysis is not None:
                on_analysis(analysis)

        def partition(joint, joint_inputs, *, num_fwd_outputs, static_lifetime_input_indices=None, **kw):
            if grow is not None:     # before Inductor's joint passes: they rewrite layers unlike each other
                if any(n != 1 for n in layout.flattened):
                    raise expand_layers.Refused("the graph's inputs are tensor subclasses (DTensors)")
                joint, static_lifetime_input_indices = grow(joint, list(static_lifetime_input_indices or []))
            primals = sum(1 for n in joint.graph.nodes if n.op == "placeholder" and not n.name.startswith("tangents"))
            params, trained = compat.joint_param_positions(layout, static_lifetime_input_indices or [], primals)
            if trained is not None:   # the memory model cannot pair gradients with primals by position here
                memory.mark_trained(joint.graph, params, trained)
            nonlocal marked
            marked = output_grads.mark(joint.graph, unused)
            averaged, memory_budget, passed = dp, config.memory_budget, False
            if decide is not None:
                if config.codegen == "inductor":      # planned on the graph Inductor's rewrites leave, as
                    joint, passed = compat.inductor_joint_passes(joint), True    # analyze_only's was
                plan_split = emit_remat.partitioner(config.codegen == "inductor")   # triton: planned as aten
                unplanned = analyze_graph(joint, *plan_split(
                    joint, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                    static_lifetime_input_indices=static_lifetime_input_indices), num_fwd_outputs, params)
                with compat.outside_fake_mode(), torch.enable_grad():   # as analyze_only's caller plans
                    averaged, memory_budget = decide(unplanned)
            if averaged is not None:
                data.reduce_gradients(joint, num_fwd_outputs=num_fwd_outputs, param_indices=params, dp=averaged)
            chunked = 0
            if chunk_loss:      # before the joint passes: under Inductor its ops were kept whole for this
                chunked = chunked_loss.rewrite(joint)
                if config.codegen == "inductor":
                    compat.decompose_nodes(joint.graph, chunked_loss.KEPT)
                    joint.recompile()
            if config.codegen in ("inductor", "triton") and not passed:
                # Inductor's joint-graph rewrites (for triton, mainly padding misaligned matmuls, which
                # cuBLAS would otherwise run with 1-element alignment: GPT-2's 50257-wide LM head)
                joint = compat.inductor_joint_passes(joint)
            if config.codegen == "triton":
                from . import fused_loss   # local import: needs triton_kernels only when asked for
                fused_loss.rewrite(joint)
            # generated kernels recompute cheap ops as Inductor's do: its min-cut partition, not aten's
            split = functools.partial(emit_remat.partitioner(config.codegen != "aten"), joint, joint_inputs,
                                      num_fwd_outputs=num_fwd_outputs,
                                      static_lifetime_input_indices=static_lifetime_input_indices)
            fw, bw = split()
            baseline = analyze_graph(joint, fw, bw, num_fwd_outputs, params)
            budget = planner.resolve_budget(memory_budget, device.memory_bytes)

            def analysis_for(fw_k, bw_k):
                return baseline.repartitioned(fw_k, bw_k, num_fwd_outputs=num_fwd_outputs, param_indices=params,
                                              recomputed=planner.recomputed_in(bw_k, joint))
            placeholders = [n for n in joint.graph.nodes if n.op == "placeholder"]
            trains = set(memory.trained(placeholders, set(params), list(bw.graph.nodes)[-1].args[0]))
            buffers = frozenset(placeholders[i].name for i in params if i not in trains)   # static, no gradient
            # a candidate's partition is modeled, not run: exactly for aten (default_partition follows the
            # tags); under min-cut (Inductor, Triton), which also places untagged views, within a few %,
            # and the planner checks the plan it chooses on its real partition
            predict = functools.partial(
                memory.predict_partition, joint.graph, num_fwd_outputs=num_fwd_outputs, param_indices=params,
                device=device, optimizer=config.optimizer, hints=baseline.hints, fused=baseline.fused)
            remat = planner.Planner(joint, split, baseline, analysis_for, buffers, predict,
                                    cache_settings=(config.codegen, repr(device), config.optimizer, averaged is not None,
                                                    inductor_fuses, marked),
                                    exact=config.codegen == "aten")
            chosen, graphs, analysis = remat.plan(budget)
            chosen = dataclasses.replace(chosen, chunked_losses=chunked)
            analysis = dataclasses.replace(analysis, plan=chosen, planner=remat)
            planned[:] = [analysis]
            if planned_out is not None:
                planned_out[:] = [analysis]
            publish(analysis)
            return graphs if graphs is not None else (fw, bw)

        params = [i for i, t in enumerate(example_inputs) if isinstance(t, torch.nn.Parameter)]

        def inference(gm_inf, inputs):  # no_grad: AOT keeps Dynamo's input order, so params are known
            if dp is not None:
                data.average_scalar_outputs(gm_inf, dp)
            publish(analyze_graph(gm_inf, None, None, 0, params), training=False)
            return codegen(gm_inf, inputs, is_backward=False, is_inference=True)

        codegen = _codegen(config, compat.num_outputs(gm), inductor_rest, planned)
        # the backward may be compiled at its first run, outside the (paused) backend call: paused there too
        compilers = [functools.partial(codegen, is_backward=False),
                     planner.gc_paused(functools.partial(codegen, is_backward=True)), inference]
        # one graph of a step Dynamo split (`step_graph`): what each forward saves is recorded for the later graphs'
        # budget, and released by its backward (`split_step`; not through AOTAutograd's cache, whose compiled
        # forward is not colauto's)
        if step_graph is not None:
            compilers[0] = lambda fw, inputs: step_graph.tracked(codegen(fw, inputs, is_backward=False))
            compilers[1] = planner.gc_paused(lambda bw, inputs: step_graph.released(codegen(bw, inputs, is_backward=True)))
        # torch's AOTAutograd cache keeps Inductor's compiled graphs between launches (not for explain or
        # profile, which need the partition to run; not for CUDA-graph wrappers; not on several ranks,
        # where the graphs hold collectives or DTensors and the cache is untested)
        cached = (config.codegen == "inductor" and not config.cudagraphs and dp is None and decide is None
                  and on_analysis is None and step_graph is None
                  and plan_cache.directory() is not None and mesh.world_size() == 1)
        key = contextlib.nullcontext()
        if cached:
            compilers = [compat.cacheable(c) for c in compilers]
            key = compat.compile_cache_keyed(plan_cache.compile_key(
                (config.memory_budget, repr(device), config.optimizer, unresolved.codegen, unused,
                 # auto's steps apart from a setting's: their backward may hold the fusion rule's code
                 (["auto"] if config.fusion_rule_over is not None else []) + sorted(cfg.rules_of(config)))))
        hits = compat.compile_cache_hits()
        with key:
            compiled = compat.aot_autograd(
                fw_compiler=compilers[0], bw_compiler=compilers[1], inference_compiler=compilers[2],
                partition_fn=partition,
                decompositions=_decompositions(config, inductor_rest, chunk_loss),
            )(gm, example_inputs)
        if compat.compile_cache_hits() > hits:
            CACHE_HITS[config.codegen] += 1
            report.emit_cache_hit(config.report)
            marked = bool(unused)   # the cached backward was compiled as this launch would have: decided alike
        if marked:
            report.emit_unused_grads(unused, config.report)
            compiled = output_grads.expecting_unused(compiled, unused)
        return compiled
    return backend


def chunks_the_loss(config: cfg.Config, example_inputs: list, one_process: bool) -> bool:
    """Whether a training graph's loss gradient is computed in the forward (chunked_loss): under a
    budget the user set, in one process, for graphs of static sizes, under codegen aten and inductor,
    with COLAUTO_CHUNKED_LOSS=on."""
    budget = config.memory_budget is not None and config.memory_budget[0] != "none"
    if config.chunked_loss != "on":
        return False
    static = all(isinstance(s, int) for t in example_inputs if isinstance(t, torch.Tensor) for s in t.shape)
    return budget and one_process and static and config.codegen in ("aten", "inductor")


def _decompositions(config: cfg.Config, inductor_rest: bool, chunk_loss: bool = False) -> dict:
    """The table AOTAutograd traces the joint graph with: Inductor's where Inductor compiles the graphs
    (codegen inductor, and triton's rest), so the partition saves what Inductor's would (traced with
    aten's ops under triton, GPT-2 saved its GELU's tanh and the qkv transposes on top: 22% above
    Inductor's peak on GPT-2 large). Under triton it keeps whole the ops colauto's passes match: the fused
    loss's (`fused_loss.MATCHED`), LayerNorm's backward (split by fusion_prep) and casts; Inductor's
    re-trace decomposes what is left of them. None for aten."""
    if config.codegen == "inductor":   # the loss's ops whole where chunked_loss may rewrite them
        kept = chunked_loss.KEPT + chunked_loss.COMPOSITES if chunk_loss else ()
        return {op: fn for op, fn in compat.inductor_decompositions().items() if op not in kept}
    if inductor_rest:
        from . import fused_loss   # local import: needs triton_kernels only under codegen triton
        aten = torch.ops.aten
        kept = (*fused_loss.MATCHED, aten.native_layer_norm_backward.default, aten._to_copy.default)
        return {op: fn for op, fn in compat.inductor_decompositions().items() if op not in kept}
    return {}


def rest_by_inductor(inputs: list) -> bool:
    """Under codegen triton, whether Inductor compiles what colauto's generated kernels leave: where
    Inductor emits Triton (CUDA, with Triton importable), so its generated wrapper fuses and launches the
    rest and, in graphs of static shapes, colauto's kernels too (`fusion.traceable`). Run op by op, the
    rest left HF models' steps host-bound: 0.46-0.94x Inductor's. On CPU, where Triton kernels
    run in its interpreter, the rest runs as aten ops: Inductor's C++ would only add compile time."""
    import triton_kernels   # local import: needs triton_kernels only under codegen triton
    return (any(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in inputs)
            and bool(triton_kernels.available()))


def _record_allocations(analysis: Analysis, tag: str, allocations: list, config: cfg.Config,
                        again: bool = False) -> None:
    """Keep what the graph `tag`'s generated code allocates on its analysis (one wrapper: the graph's own;
    none: Inductor took the graph from its cache, or planned memory its own way); once every graph of
    the step has been read, report the compiled code's peak beside the model's."""
    if len(allocations) != 1:
        compat.WRAPPER_UNREAD["from Inductor's cache" if not allocations else "several wrappers"] += 1
        return
    analysis.allocations[tag] = allocations[0]
    compiled = analysis.compiled_peak()
    if compiled is not None:
        report.emit_compiled_peak(analysis, compiled, config.report, analysis.compiled_peak(outputs_dropped=True),
                                  held=config.held_budget, again=again or config.compiled_again_if_over)


def _codegen(config: cfg.Config, user_outputs: int, inductor_rest: bool = False,
             planned: Sequence[Analysis] = ()) -> Callable:
    """The compiler for one Dynamo graph's forward, backward and inference graphs; `user_outputs`: how
    many outputs the Dynamo graph has (Inductor keeps their strides as eager's); `inductor_rest`: under
    codegen triton, Inductor compiles what the kernels leave (`rest_by_inductor`, decided once per
    Dynamo graph, as the memory model was). `planned`: the training graph's analysis, once partitioned.
    Where its plan recomputes (forward ops its backward runs again), Inductor runs the plan as the
    memory model has it (`compat.run_with_inductor`'s `remat`); else Inductor compiles as for
    torch.compile. Each graph Inductor compiles records what its code allocates on the analysis
    (`Analysis.allocations`), and once every graph of the step has, COLAUTO_REPORT gets the peak of
    the compiled code beside the model's (`report.emit_compiled_peak`)."""
    recorder = cuda_graphs.Recorder(config.report) if config.cudagraphs else None

    def run(gm, inputs, *, is_backward, is_inference=False):
        remat = None
        analysis = planned[0] if planned and not is_inference else None
        if analysis is not None and analysis.recomputed:
            recomputed = frozenset(n.name for n in gm.graph.nodes
                                   if n.op == "call_function" and n.name in analysis.recomputed) if is_backward else frozenset()
            remat = compat.RematCodegen(recomputed, memory.needed_at(gm.graph, recomputed) if recomputed else {},
                                        cfg.rules_of(config))
        if is_backward:   # marked tangents read as zeros, and take None (none marked: nothing changes)
            inputs = output_grads.specialize(gm, inputs)
        # whether the graph can be recorded, read once, before any code generation rewrites `gm`
        reason = recorder.reason(gm, inputs, is_backward=is_backward) if recorder is not None else None
        kind = "inference" if is_inference else "backward" if is_backward else "forward"
        scheduled = overlap.schedule_collectives(gm, kind)   # a plan's collectives run under the compute after them
        if scheduled is not None:
            report.emit_collectives(dataclasses.asdict(scheduled), config.report)
        inductor = config.codegen == "inductor"
        if config.codegen == "triton":
            from . import fusion   # local import: needs triton_kernels only when asked for
            inductor = inductor_rest
            # a lone op is worth a kernel only where a replayed graph makes its call free of CPU time (and
            # where Inductor compiles the rest, it fuses the lone ops itself)
            done = fusion.fuse(gm, lone_ops=not inductor and recorder is not None and reason is None,
                               recomputed=remat.recomputed if remat is not None else frozenset())
            if inductor:   # Inductor launches the kernels from its wrapper where it can (fusion.traceable)
                gm, done.wrapped = compat.decomposed_for_inductor(gm, inline=fusion.traceable)
                REST_BY_INDUCTOR[kind] += 1
            report.emit_fusion(dataclasses.asdict(done) | {"graph": kind, "rest": "inductor" if inductor else "aten"},
                               config.report)
        if inductor:
            refused = sum(compat.RECOMPUTE_KEPT_APART.values())
            # auto rules held to a budget (`_held_to_budget`): a backward compiled with Inductor's horizontal
            # fusions of recomputation whose step peaks over the budget, or whose peak was not read (Inductor
            # took the graph from its cache), is compiled again refusing them, from a copy taken before
            # Inductor's passes rewrote the graph (outside AOTAutograd's fake mode: a tensor constant the
            # graph holds is real)
            limit = (config.fusion_rule_over if is_backward and analysis is not None and remat is not None
                     and remat.recomputed and "fusion" not in remat.rules else None)
            pristine = None
            if limit is not None:
                with compat.outside_fake_mode():
                    pristine = (copy.deepcopy(gm), list(inputs))

            def generate(gm, inputs, remat, allocations):
                return compat.run_with_inductor(gm, inputs, is_backward=is_backward, is_inference=is_inference,
                                                num_user_outputs=user_outputs,
                                                own_buckets=scheduled is not None and scheduled.waits_moved > 0,
                                                own_gathers=scheduled is not None and scheduled.gathers_prefetched > 0,
                                                keep_order=scheduled is not None and scheduled.kept_in_order,
                                                remat=remat, allocations=allocations)
            allocations: list | None = [] if analysis is not None else None
            fn = generate(gm, inputs, remat, allocations)
            if analysis is not None:
                _record_allocations(analysis, "bwd" if is_backward else "fwd", allocations, config,
                                    again=limit is not None)
            peak = analysis.compiled_peak() if limit is not None else None
            if pristine is not None and (peak is None or peak[0] > limit):
                gm, inputs = pristine
                remat = dataclasses.replace(remat, rules=remat.rules | {"fusion"})
                FUSION_REFUSED_AGAIN["peak over the budget" if peak is not None else "peak not read (Inductor's cache)"] += 1
                report.emit_replanned({"compiled_bytes": None if peak is None else peak[0], "budget_bytes": limit,
                                       "over_bytes": None if peak is None else peak[0] - limit,
                                       "rules": sorted(remat.rules)}, config.report)
                analysis.allocations.pop("bwd", None)   # the second compile's, or none (from Inductor's cache)
                analysis.recompiled_rules = remat.rules
                allocations = []
                fn = generate(gm, inputs, remat, allocations)
                _record_allocations(analysis, "bwd", allocations, config)
            if remat is not None and remat.recomputed:
                report.emit_planned_rules({"recomputed": len(remat.recomputed), "rules": sorted(remat.rules),
                                           "fusions_refused": sum(compat.RECOMPUTE_KEPT_APART.values()) - refused},
                                          config.report)
        else:
            fn = compat.run_as_aten(gm, inputs)
        if recorder is None:
            return fn
        return recorder.wrap(fn, gm, inputs, reason, is_backward=is_backward, is_inference=is_inference)
    return run
