"""The distributed path of the backend: plan once on the first graph, shard, then compile SPMD graphs."""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import gc
import math
import sys
from typing import Callable

import torch
import torch.distributed as dist
import torch.fx as fx
from torch.distributed.tensor import DTensor

from .. import _torch_compat as compat
from .. import counters, expand_layers, meta, planner, progress, report
from ..config import Config, ConfigError
from . import data
from . import _dtensor_rules, choose, comm, emit, fsdp, mesh, strategy, tp_graph
from .plan import ParallelPlan

# Share of device memory the plan may use when COLAUTO_MEMORY_BUDGET is unset. The layer DP spends
# what it is given (replicating layers to save communication); on 4 H200s a 13B-shape DDP step failed
# with 3 GiB reserved but unallocated, so a whole-device default would leave too little slack.
DEFAULT_BUDGET_FRACTION = 0.9
SHARDED: collections.deque[emit.Sharded] = counters.records("sharded modules", maxlen=None)   # sharded in this process
PLANS: collections.deque[ParallelPlan] = counters.records("parallel plans", maxlen=None)   # each graph compiled on several ranks
ON_DTENSORS = counters.counter("sharded plans without tp run as DTensor modules, not on the captured graph")
_COMPILED: dict[tuple, Callable] = {}     # SPMD graph (code, grad mode, inputs) -> compiled, no Sharded owner


def _signature(t) -> tuple:
    if isinstance(t, DTensor):
        return ("dtensor", tuple(t.shape), t.dtype, tuple(t.placements), id(t.device_mesh), t.requires_grad)
    if isinstance(t, torch.Tensor):
        return ("tensor", tuple(t.shape), t.dtype, t.requires_grad)
    return ("value", repr(t))


def active(config: Config) -> bool:
    """Distributed when launched on several ranks, or when COLAUTO_MESH asks for more than one device."""
    return mesh.world_size() > 1 or (config.mesh is not None and math.prod(s for _, s in config.mesh) > 1)


def compile(gm: fx.GraphModule, example_inputs: list, config: Config, make_local: Callable) -> Callable:
    """`make_local()` is the single-device backend; `make_local(dp)` the same averaging gradients over `dp`."""
    if any(isinstance(t, DTensor) for t in example_inputs):      # the re-trace of a sharded module
        key = (gm.code, torch.is_grad_enabled(), tuple(_signature(t) for t in example_inputs))
        owner = next(filter(None, map(emit.owner, example_inputs)), None)
        # one cache per sharded module: its compiled graphs are bound to it (its gradients, its outputs), and
        # the key's mesh id can be a dead module's reused address (a second model got the first's graph)
        cache = owner.compiled if owner is not None else _COMPILED
        if key not in cache:    # the first call compiled it; the user's recompile traces the same graph
            # plain mode: the graph's losses are each rank's, averaged as under data parallelism
            plain = owner is not None and owner.plain
            # each rank's graphs are compiled (and rematerialized) under the budget the plan was made for
            budget = _planned_budget(owner.plan) if owner is not None else None
            compiled = make_local(data.DataParallel.world_group(reduce_grads=False) if plain else None,
                                  budget)(gm, example_inputs)
            # with tp, its DTensor outputs are tied to the module's loss (a graph break's can go unused)
            compiled = compiled if owner is None or plain else owner.holding_outputs(compiled)
            # gradients the script cleared on one side are freed on the other before the forward runs
            cache[key] = compiled if owner is None else owner.releasing_cleared_grads(compiled)
        return cache[key]
    candidates = mesh.candidates(config.mesh, mesh.world_size())  # a COLAUTO_MESH that cannot fit: say so first
    mesh.ensure_process_group()
    if not any(isinstance(t, torch.nn.Parameter) for t in example_inputs):
        # no model state: nothing to place. Its inputs are each rank's own (its micro-batch, or the
        # outputs of a graph before a break), so a loss it computes is the rank's: averaged, as any
        # graph's 0-dim floating outputs on several ranks (parallel/data.py)
        return _data_parallel(gm, example_inputs, make_local, None)
    names, params = graph_params(gm, example_inputs)
    if all(role == "dp" for axes in candidates for role, _ in axes):   # COLAUTO_MESH=dp=N: nothing to choose
        plan = ParallelPlan(candidates[0], {n: ("R",) for n in params}, {n: ("R",) for n in params})
        PLANS.append(plan)
        announce(plan)
        return _data_parallel(gm, example_inputs, make_local, None)
    from ..backend import capture_serves_planning   # local import: the backend imports this module
    plans: list[ParallelPlan] = []
    routes: list[str] = []
    # what `decide` reads, emptied once compiled: torch 2.11 keeps the partitioner that calls `decide` as
    # long as the compiled graph, and the inputs would live as long (tests/test_held_tensors.py)
    capture = [gm, example_inputs]

    def decide(analysis) -> tuple[data.DataParallel | None, tuple[str, float]]:
        """From the capture being compiled: its plan, and how this first call runs (`_first_call`); a plan
        that runs on the captured graph with its gathers stops this compile (`_Regather`). No collective
        runs here, inside AOTAutograd's partitioner (gloo hung there, 1 launch in 3)."""
        plans.append(plan_graph(*capture, names, params, config, candidates,
                                prefer_data_parallel=config.mesh is None, analysis=analysis))
        routes.append(_route(plans[0], config, names, capture[1]))
        if routes[0] in ("graph", "tp graph"):
            raise _Regather()
        return _first_call(plans[0])

    compiled = None
    if capture_serves_planning(config, example_inputs):
        # one capture: the plan is made from the joint graph AOTAutograd traces for this compile
        try:
            compiled = make_local(decide=decide)(gm, example_inputs)
        except _Regather:
            pass
        capture.clear()
        plan, route = plans[0], routes[0]
    else:
        plan = plan_graph(gm, example_inputs, names, params, config, candidates,
                          prefer_data_parallel=config.mesh is None)
        route = _route(plan, config, names, example_inputs)
        if route != "graph":
            compiled = make_local(*_first_call(plan))(gm, example_inputs)
    _adopt(plan, config)      # the ranks check they made the same plan before anything runs
    if route == "graph":      # parallel/fsdp.py: the user's Parameters cut in place, gathered in the graph
        return fsdp.compile(gm, example_inputs, plan, functools.partial(make_local, memory_budget=_planned_budget(plan)))
    if route == "tp graph":   # parallel/tp_graph.py: the captured graph lifted over the ranks, run on DTensors
        try:
            return tp_graph.compile(gm, example_inputs, plan,
                                    functools.partial(make_local, memory_budget=_planned_budget(plan)))
        except tp_graph.NotLifted as exc:
            if fsdp.reads_cut(example_inputs):   # the DTensor path cannot take parameters already cut
                raise ConfigError(f"colauto: a graph reads parameters an earlier graph cut in place, and its tp plan "
                                  f"({plan.mesh_str}) cannot run on the captured graph ({exc}): remove the graph "
                                  "break (TORCH_LOGS=graph_breaks names it), or set COLAUTO_MESH without tp") from None
            _refuse_batch_norm_on_dtensors(gm, plan, config, str(exc))
            tp_graph.NOT_LIFTED[str(exc)] += 1
            if report._rank() == 0:
                print(f"colauto: plan {plan.mesh_str} runs as DTensor modules (the model re-traced), not on the "
                      f"captured graph: {exc}", flush=True)
            compiled = make_local(*_first_call(plan))(gm, example_inputs)
    if plan.data_parallel_only:
        data.prepare(gm, example_inputs, data.DataParallel.world_group())
        return _checked_gradients(gm, example_inputs, compiled)
    _refuse_batch_norm_on_dtensors(gm, plan, config, "COLAUTO_FSDP=dtensor")
    if route.startswith("dtensor: "):     # COLAUTO_FSDP=graph asked, a plan it cannot run: counted and said
        ON_DTENSORS[route[len("dtensor: "):]] += 1
        if report._rank() == 0:
            print(f"colauto: plan {plan.mesh_str} runs as DTensor modules, not on the captured graph: "
                  f"{route[len('dtensor: '):]}", flush=True)
    return _shard(gm, example_inputs, plan, compiled)


def _refuse_batch_norm_on_dtensors(gm: fx.GraphModule, plan: ParallelPlan, config: Config, why: str) -> None:
    """A tp plan of a BatchNorm model with codegen inductor does not run on the DTensor path: there HF ResNet's
    stem convolution's weight gradient came out 1.6% off its micro-batch reference in the first tp step
    (aten: exact; on the captured graph, parallel/tp_graph.py, exact under both; cause not found)."""
    if plan.tensor_parallel and config.codegen == "inductor" and _dtensor_rules.normalizes_batches(gm):
        raise ConfigError(
            "COLAUTO_MESH: tensor parallelism with codegen inductor trains this BatchNorm model wrong on the DTensor "
            f"path, where its graph went ({why}): set COLAUTO_CODEGEN=aten with tp, or use dp or fsdp axes "
            "(COLAUTO_MESH=fsdp=N, or unset)")


class _Regather(Exception):
    """Stops the first compile where the plan runs on the captured graph with gathers in it (`_route`):
    that graph is compiled instead (parallel/fsdp.py)."""


def _route(plan: ParallelPlan, config: Config, names: dict[int, str], example_inputs: list) -> str:
    """How `plan` runs on this graph: "graph" (parallel/fsdp.py: its shards, and parameters an earlier
    graph cut, gathered in the captured graph), "tp graph" (parallel/tp_graph.py: a tp plan on the captured
    graph, or, where that graph cannot be lifted, the DTensor path), "dp" (data parallelism as captured),
    "dtensor" (the sharded module's DTensor path: COLAUTO_FSDP=dtensor), or "dtensor: REASON"
    (COLAUTO_FSDP=graph could not run it). A graph reading parameters an earlier graph cut runs on the
    captured graph or not at all."""
    cut = fsdp.reads_cut(example_inputs)      # parameters an earlier graph (before a break) cut in place
    if config.fsdp != "graph" and not cut:
        return "dp" if plan.data_parallel_only else "dtensor"
    if plan.data_parallel_only and not cut:
        return "dp"
    reason = ("its plan is tensor-parallel" if plan.tensor_parallel
              else fsdp.unsupported(plan, names, example_inputs))
    if reason is None:
        return "graph"
    if plan.tensor_parallel:
        return "tp graph"
    if cut:
        raise ConfigError("colauto: a graph after a graph break reads parameters an earlier graph sharded in "
                          f"place, and {reason} ({plan.mesh_str}), which the captured graph cannot run: remove the "
                          "graph break (TORCH_LOGS=graph_breaks names it), or set COLAUTO_MESH without tp")
    return "dtensor" if plan.tensor_parallel else f"dtensor: {reason}"


def _first_call(plan: ParallelPlan) -> tuple[data.DataParallel, tuple[str, float]]:
    """How the captured graph is compiled for its first call under `plan`: data parallelism under the
    plan's budget, or, for a sharded plan, data parallelism on the gathered parameters (the shards'
    reads reduce the gradients) without a budget (see `_shard`)."""
    if plan.data_parallel_only:
        return data.DataParallel.world_group(), _planned_budget(plan)
    return data.DataParallel.world_group(reduce_grads=False), ("none", 0.0)


def _adopt(plan: ParallelPlan, config: Config) -> None:
    """Every rank checks it made the same plan, which is recorded, announced and reported."""
    check_same_plan(plan)
    PLANS.append(plan)
    announce(plan)
    report.emit_parallel(plan.to_json(), config.report)


def _shard(gm: fx.GraphModule, example_inputs: list, plan: ParallelPlan, compiled: Callable) -> Callable:
    """The graph's module sharded by `plan`; `compiled`: this first call's step (see below)."""
    root = owner_module(gm, example_inputs)
    # one DeviceMesh per set of axes in a process, whichever path made it first: DTensor caches sharding
    # decisions under meshes that compare equal, so a second mesh met decisions holding the first (after a tp
    # plan ran on the captured graph, HF T5's DTensor re-trace failed: "Node tangents_2 was invalid")
    sharded = emit.Sharded(root, plan, fsdp.built_mesh(plan.axes))
    SHARDED.append(sharded)
    # the first call runs this captured graph as data parallelism on the gathered parameters (each rank's
    # loss averaged, gradients averaged back into the shards); Dynamo then re-traces the sharded module.
    # That one step is outside the plan (whole parameters and gradients; the optimizer state lives with
    # the shards), so it is compiled without a budget: under the plan's, the single-device memory model
    # counted whole-parameter optimizer state, and every model that needs sharding to fit stopped here
    # with BudgetError (HF Llama-3-8B on 4 H100s: 120 GiB asked of a 71.7 GiB budget)
    return sharded.first_call(compiled, example_inputs)


_ANNOUNCED: set[str] = set()


def announce(plan: ParallelPlan) -> None:
    """One line on rank 0, once per distinct plan, whatever COLAUTO_REPORT says: the mesh chosen."""
    if plan.digest() in _ANNOUNCED or report._rank() != 0:
        return
    _ANNOUNCED.add(plan.digest())
    p = plan.predicted
    effective = p.get("effective_mesh", plan.mesh_str)
    line = f"colauto: mesh {plan.mesh_str}" + (f" ({effective} in effect)" if effective != plan.mesh_str else "")
    if p:
        budget = "" if p.get("budget_bytes") is None else f" of {report.fmt_bytes(p['budget_bytes'])}"
        line += (f", predicted {p['step_time_s'] * 1e3:.1f} ms a step and peak {report.fmt_bytes(p['memory_bytes'])}"
                 f"{budget} per device (COLAUTO_REPORT=1 for the plan)")
    else:
        line += " (named by COLAUTO_MESH: data parallelism on the captured graph)"
    print(line, flush=True)


def _data_parallel(gm: fx.GraphModule, example_inputs: list, make_local: Callable, memory_budget) -> Callable:
    """The captured graph as it is on every rank, its gradients averaged in the graph (parallel/data.py),
    compiled under `memory_budget` (a Config.memory_budget; None: COLAUTO_MEMORY_BUDGET's)."""
    dp = data.DataParallel.world_group()
    data.prepare(gm, example_inputs, dp)
    return _checked_gradients(gm, example_inputs, make_local(dp, memory_budget)(gm, example_inputs))


def _checked_gradients(gm: fx.GraphModule, example_inputs: list, compiled: Callable,
                       live: list[torch.nn.Module] | None = None) -> Callable:
    """`compiled` (a data-parallel graph), with gradients no compiled graph averaged averaged over the ranks
    (a parameter FSDP cut: refused), `data.check_eager_gradients`. `live`: `_live_modules()`, if the caller
    has scanned for them already (a scan of every Python object: 0.45 s with 3 million of them)."""
    if not any(isinstance(t, torch.nn.Parameter) for t in [*example_inputs, *gm.parameters()]):
        return compiled
    live = _live_modules() if live is None else live
    try:
        module = owner_module(gm, example_inputs, live)
    except (RuntimeError, IndexError):
        # no one module holds the graph's parameters (a compiled training-step function over several
        # modules, parameters passed as arguments, a compiled optimizer step): no check, counted
        data.UNCHECKED["no one module holds the graph's parameters"] += 1
        return compiled
    # the outermost module holding it: where Dynamo skipped the compiled module's own frame (HF Qwen2-MoE under
    # transformers 5.17: "falling back to eager"), graphs belong to submodules, and the parameters only eager
    # code reads (its embedding, its experts) got no hook: each rank kept its own gradient, and the ranks'
    # parameters drifted apart under dp, fsdp and tp
    return data.check_eager_gradients(_outermost(module, live), gm, compiled, example_inputs, cut=fsdp.is_cut)


def _live_modules() -> list[torch.nn.Module]:
    """Every live nn.Module (one scan of the garbage collector's objects). type(): isinstance would follow dead
    weak proxies."""
    return [obj for obj in gc.get_objects() if issubclass(type(obj), torch.nn.Module)]


def _outermost(module: torch.nn.Module, live: list[torch.nn.Module]) -> torch.nn.Module:
    """The outermost live module that holds `module` (itself if none does), through the modules' own child
    dictionaries (no attribute access: see `_stored_parameter`); torch.compile's wrapper does not count (its
    parameters' names would start with `_orig_mod.`)."""
    from torch._dynamo.eval_frame import OptimizedModule   # torch.compile's wrapper: not the user's module
    parent: dict[int, torch.nn.Module] = {}
    for obj in live:
        if not issubclass(type(obj), OptimizedModule):
            for child in vars(obj).get("_modules", {}).values():
                if child is not None:
                    parent.setdefault(id(child), obj)
    seen = {id(module)}
    while id(module) in parent and id(parent[id(module)]) not in seen:
        module = parent[id(module)]
        seen.add(id(module))
    return module


def _planned_budget(plan: ParallelPlan) -> tuple[str, float]:
    """Each rank's graphs are compiled (and rematerialized) under the budget the plan was made for."""
    b = plan.predicted["budget_bytes"]
    return ("none", 0.0) if b is None else ("bytes", float(b))


def state_names(gm: fx.GraphModule) -> dict[int, str]:
    """Graph input position -> the parameter or buffer's name under the compiled module (from Dynamo's
    sources: whatever the module's forward calls itself, and in any graph of a graph break)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return {i: name for i, n in enumerate(placeholders) if (name := compat.state_fqn(n)) is not None}


def graph_params(gm: fx.GraphModule, example_inputs: list) -> tuple[dict[int, str], dict[str, torch.Tensor]]:
    """(input position -> state name, parameter name -> the Parameter) of one captured graph."""
    names = state_names(gm)
    return names, {names[i]: t for i, t in enumerate(example_inputs)
                   if i in names and isinstance(t, torch.nn.Parameter)}


def plan_graph(gm: fx.GraphModule, example_inputs: list, names: dict[int, str], params: dict,
               config: Config, candidates: list, prefer_data_parallel: bool = False,
               analysis=None, layout: Callable[[int], strategy.TPLayout] | None = None) -> ParallelPlan:
    """The plan for one captured graph among `candidates` meshes (no process group needed); `analysis`:
    the graph's unplanned analysis, if its capture was made (else captured here, `analyze_only`). `names`:
    the analysis's joint graph's input position -> parameter name; `layout`: the tp layout for a tp size, where
    the joint is not the graph's own (else read off `gm`, whose input positions are the joint's).

    With `prefer_data_parallel` (the automatic plan), data parallelism is taken wherever it fits the
    budget (with rematerialization if need be), and sharded meshes are weighed only where it does not.
    Data parallelism adds only gradient averaging to the captured graph; sharded plans now run on the
    captured graph too (parallel/fsdp.py, parallel/tp_graph.py: every HF model of the CPU matrix trains
    like one process under them), but their predicted step times have no GPU measurement on that path
    yet (issue 15's 4-GPU must-shows), so a faster predicted sharded plan does not displace dp."""
    from ..backend import analyze_only   # local import: the backend imports this module
    if analysis is None:
        progress.say("costing the joint forward+backward graph (AOTAutograd, cost model, rematerialization)")
        with torch.enable_grad():    # plan for training, even when the first call is an evaluation
            analysis = analyze_only(config, gm, example_inputs)
    _register_rules()
    missing = _dtensor_rules.uncovered(analysis.joint)
    if missing and config.codegen == "inductor":
        # DTensor runs the ops before Inductor's decompositions (those go to each rank's local graph):
        # check the graph without them
        with torch.enable_grad():
            missing = _dtensor_rules.uncovered(analyze_only(dataclasses.replace(config, codegen="aten"), gm,
                                                            example_inputs).joint)
    no_tp = _without_tp(candidates)
    replicated_ops, replicated_bytes = (), 0     # ops a tp plan runs replicated, their inputs' bytes a step
    if missing and len(no_tp) < len(candidates):
        fixed = [name for name, nodes in missing.items() if _dtensor_rules.replicable(nodes[0].target)]
        refused = [name for name in missing if name not in fixed]
        if refused:
            # tensor parallelism runs the model's ops on DTensor activations, which would fail on these; dp
            # and fsdp run them on plain tensors (only parameter reads are DTensor ops) and need no rule
            if not no_tp:
                raise ConfigError(
                    f"COLAUTO_MESH: tensor parallelism cannot run {', '.join(refused)}, which this model's training "
                    "step runs (DTensor has no rule for it that colauto can use: it mutates an input or takes a list of "
                    "tensors): use dp or fsdp axes (COLAUTO_MESH=fsdp=N, "
                    "or unset), or register a rule with torch.distributed.tensor.experimental.register_sharding")
            candidates = no_tp
        else:
            replicated_ops = tuple(fixed)
            replicated_bytes = sum(_input_bytes(n) for name in fixed for n in missing[name])
    layout = layout or (lambda size: strategy.tp_layout(gm, names, size))
    tp_layout = lambda size: dataclasses.replace(layout(size),  # noqa: E731
                                                 replicated_ops=replicated_ops, replicated_bytes=replicated_bytes)
    link = comm.resolve(config.comm, analysis.device.name)
    budget = planner.resolve_budget(config.memory_budget, analysis.device.memory_bytes)
    if config.memory_budget is None:   # unset: leave room for NCCL's buffers and allocator fragmentation
        budget = int(budget * DEFAULT_BUDGET_FRACTION)
    def pick(meshes: list) -> ParallelPlan:
        progress.say(f"planning: {len(meshes)} candidate meshes, each with its per-layer placement and recomputation")
        return choose.choose(meshes, params, tp_layout, analysis, link, budget, names)
    data_parallel = [axes for axes in candidates if all(role == "dp" for role, _ in axes)]
    if prefer_data_parallel and data_parallel and len(data_parallel) < len(candidates):
        try:
            return pick(data_parallel)
        except planner.BudgetError:
            pass        # data parallelism does not fit: weigh the sharded meshes too
    return pick(candidates)


def _without_tp(candidates: list) -> list:
    """The candidate meshes with no tensor-parallel axis."""
    return [axes for axes in candidates if all(role != "tp" for role, _ in axes)]


def _input_bytes(node: fx.Node) -> int:
    """Bytes of a joint-graph node's tensor inputs at their example sizes."""
    total = 0
    for a in node.all_input_nodes:
        v = a.meta.get("val")
        if isinstance(v, torch.Tensor):
            total += math.prod(compat.example_int(s) for s in v.shape) * v.element_size()
    return total


class _Planned(Exception):
    pass


NOT_EXPANDED = counters.counter("explain: models traced whole, their layers not expanded")


def plan_model(model: torch.nn.Module, example_inputs: tuple, config: Config, world: int,
               kwargs: dict | None = None, expand: bool = True) -> ParallelPlan:
    """The plan colauto would run for `model` on `world` devices, from this one process: no process
    group, no kernel, nothing sharded (explain's distributed form).

    With `expand`, a model whose repeated layer list is longer than expand_layers.K is traced with K of its
    layers, and its joint graph expanded to all of them before it is costed: a Llama-3-8B traces 4 layers, not
    32. A model whose layers cannot be shown alike (expand_layers.expandable, .grow) is traced whole, counted in
    NOT_EXPANDED and said on stderr."""
    lengths, why = expand_layers.expandable(model) if expand else ({}, None)
    if lengths and why is None:
        try:
            return _plan_traced(model, example_inputs, config, world, kwargs, lengths)
        except expand_layers.Refused as exc:
            why = str(exc)
    if why is not None:
        NOT_EXPANDED[why] += 1
        if lengths:      # a model with no repeated list has nothing to expand: no line
            print(f"colauto explain: tracing every layer (slower), its layers cannot be expanded: {why}",
                  file=sys.stderr, flush=True)
    return _plan_traced(model, example_inputs, config, world, kwargs, {})


def _plan_traced(model: torch.nn.Module, example_inputs: tuple, config: Config, world: int, kwargs: dict | None,
                 lengths: dict[str, int]) -> ParallelPlan:
    """`plan_model`, tracing expand_layers.K layers of each list of `lengths` (list -> layers) and expanding the
    joint graph to them, or (empty) tracing the whole model."""
    plans: list[ParallelPlan] = []
    whole = dict(model.named_parameters(remove_duplicate=False))    # before the lists are cut; tied ones by each name

    def backend(gm, inputs):
        names, params = graph_params(gm, inputs)
        progress.say(f"captured: {sum(1 for _ in gm.graph.nodes)} graph nodes, {len(params)} parameters")
        candidates = mesh.candidates(config.mesh, world)
        if not lengths:
            plans.append(plan_graph(gm, inputs, names, params, config, candidates))
            raise _Planned()
        grown: list[expand_layers.Grown] = []

        def grow(joint, static):
            joint, static, g = expand_layers.grow(joint, static, names, lengths)
            grown.append(g)
            progress.say(f"expanded the joint graph to {', '.join(f'{n} layers of {p}' for p, n in lengths.items())}")
            return joint, static
        progress.say("costing the joint forward+backward graph (AOTAutograd, cost model, rematerialization)")
        from ..backend import analyze_only   # local import: the backend imports this module
        with torch.enable_grad():
            analysis = analyze_only(config, gm, inputs, grow)
        g = grown[0]
        params = {name: whole[name] for name in g.names.values() if name in whole}
        plan = plan_graph(gm, inputs, g.names, params, config, candidates, analysis=analysis,
                          layout=lambda size: strategy.tp_layout(gm, names, size).expanded(g.rename))
        plans.append(dataclasses.replace(plan, predicted=plan.predicted | {"traced_layers": {
            p: [expand_layers.K, n] for p, n in lengths.items()}}))
        raise _Planned()
    on_meta = meta.on_meta(*example_inputs, *(kwargs or {}).values(), next(model.parameters(), None))
    progress.say("capturing the training step (Dynamo)" + "".join(
        f", {expand_layers.K} of the {n} layers of {p}" for p, n in lengths.items()))
    cut = expand_layers.truncated(model, expand_layers.K) if lengths else contextlib.nullcontext()
    try:
        # a meta model: attention as a GPU runs it; the collector paused over Dynamo's trace too
        # HF's loss logs a warning the first time a model computes it: a no-op to Dynamo, as in profile()
        with cut, meta.gpu_attention(on_meta), planner.gc_off(), compat.sizes_forgotten(static=True), \
                compat.logging_ignored():
            torch.compile(model, backend=backend, fullgraph=True)(*example_inputs, **(kwargs or {}))
    except Exception as exc:  # noqa: BLE001 - unwrap Dynamo's wrapper, re-raise anything else
        inner = compat.unwrap_backend_error(exc)
        if not isinstance(inner, _Planned):
            raise (inner if inner is not exc else exc) from None
    return plans[0]


@functools.cache
def _register_rules() -> None:
    _dtensor_rules.shard_cpu_attention()       # DTensor has no rule for CPU flash attention
    _dtensor_rules.shard_attention_masks()     # CUDA's fused attention with a mask (HF's), under tp
    _dtensor_rules.shard_padding()             # HF's loss pads the labels (torch 2.11: a one-dim stub)
    _dtensor_rules.batch_norm_per_rank()       # BatchNorm's statistics per rank, as under dp (DTensor's: global)
    _dtensor_rules.shard_batch_norm_backward()  # its backward by channel where DTensor has no rule (2.11, 2.12)
    _dtensor_rules.convolution_weight_grads_replicated_where_the_input_is()   # 2.11: Partial whatever the input
    _dtensor_rules.index_put_never_sharded_on_an_indexed_dim()   # 2.11: sharded on an indexed dim


def owner_module(gm: fx.GraphModule, example_inputs: list, live: list | None = None) -> torch.nn.Module:
    """The module the graph's parameters are named under (the compiled one, or the module a graph after a
    break runs in), found among the live modules (`live`, else `_live_modules()`) by those names: no frame
    is read."""
    pairs = list(graph_params(gm, example_inputs)[1].items())
    first_name, first = pairs[0]
    for obj in _live_modules() if live is None else live:
        if _stored_parameter(obj, first_name) is first and all(_stored_parameter(obj, n) is t for n, t in pairs):
            return obj
    raise RuntimeError("colauto: no live module holds this graph's parameters under the names Dynamo traced "
                       f"({first_name}, ...): compile the nn.Module that owns them")


def _stored_parameter(module: torch.nn.Module, name: str) -> torch.Tensor | None:
    """The parameter `module` stores under a dotted name, read from the modules' own dictionaries: no
    attribute access, so no property runs (a module sharded earlier gathers its parameters in one: a
    collective on the ranks whose garbage collector had not yet freed it, and a hang)."""
    *path, leaf = name.split(".")
    for part in path:
        module = vars(module).get("_modules", {}).get(part)
        if module is None:
            return None
    return vars(module).get("_parameters", {}).get(leaf)


def check_same_plan(plan: ParallelPlan) -> None:
    """Every rank must run the same program: compare plan digests, fail loudly instead of hanging."""
    digests = [None] * dist.get_world_size()
    dist.all_gather_object(digests, plan.digest())
    if len(set(digests)) > 1:
        groups = {d: [r for r, x in enumerate(digests) if x == d] for d in set(digests)}
        raise RuntimeError(f"colauto: the ranks planned different programs (plan digest -> ranks: {groups}); "
                           "give every rank the same model, inputs shapes and COLAUTO_* settings")
