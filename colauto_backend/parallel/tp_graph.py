"""Tensor parallelism on the captured graph: the graph Dynamo captured, lifted over the ranks and run on DTensors.

A tp plan (any mesh with a tp axis the plan uses) runs here by default: the module is not re-traced, no
class is swapped and no parameter is replaced (`emit.Sharded`, the DTensor path, is what runs otherwise:
COLAUTO_FSDP=dtensor, or a graph this path cannot lift, counted and said). Inside the backend call, for
the one captured graph:

1. **Pins.** Each linear whose weight the plan shards over tp gets a pin (`colauto::tp_pin`, an identity
   custom op): a column linear's input is gathered over tp, a row linear's partial-sum output is
   reduce-scattered back to batch shards (Megatron with sequence parallelism along the batch).
2. **Lift.** The graph computes one rank's micro-batch, with its sizes written in as literals (a view to
   (B, T, heads, dim)). It is lifted by `vmap` over a new leading "which rank" dim: each tensor input that is
   not a parameter or buffer is stacked, and `make_fx` records the lifted aten graph. Literal sizes stay
   right, a micro-batch of 1 works, and inputs need not be batch-first.
3. **Run on DTensors inside AOTAutograd's trace.** The stack dim is sharded over every mesh axis (each rank
   holds its own micro-batch); parameters are `DTensor.from_local(shard, storage)` redistributed to their
   compute placement (fsdp's gather, whose backward reduce-scatters); buffers and values the graph makes
   (positions, masks) are replicated. DTensor's sharding rules place every other op, and its autograd gives
   the backward's collectives; the compiled local graph holds them all. Each rank's outputs are its own
   micro-batch's; 0-dim losses are averaged as under data parallelism (`data.py`), and gradients are the
   mean over the ranks (`_Mean`).
4. **Parameters cut in place** (as `fsdp.py` does): each sharded Parameter's `.data` becomes the rank's
   piece of its storage placement, so an optimizer built before compiling steps on it; `state_dict()` gives
   DTensors (`fsdp._expose_as_dtensors`), and Dynamo sees full-shape stand-ins when it traces later.

A later graph (a `no_grad` call first, then training; a graph after a break) reads a parameter an earlier
graph cut as it was cut, whatever its own plan says, and cuts the ones its plan shards that are still whole.

Not lifted (the DTensor path runs them, said on rank 0 and counted in `NOT_LIFTED`): graphs with symbolic
sizes, graphs vmap cannot lift (in-place updates of buffers: BatchNorm's running statistics in training),
and graphs DTensor cannot run (T5's attention: a view of a strided shard). A graph that reads parameters
already cut and cannot be lifted is one line (`entry.compile`): the DTensor path cannot take cut
parameters. An op DTensor cannot place in a graph that is lifted runs replicated (all its inputs
gathered), counted in `RUN_REPLICATED`. Research and the experiment behind this design:
bench/sessions/tp_research/FINDINGS.md.
"""
from __future__ import annotations

import operator
from typing import Callable

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.distributed.tensor import DTensor, Replicate, Shard

from .. import _torch_compat as compat
from .. import counters, report
from . import _dtensor_rules, data, fsdp
from .plan import ParallelPlan

LIFTED = counters.counter("tp graphs lifted over the ranks and run on DTensors (parallel/tp_graph.py)")
NOT_LIFTED = counters.counter("tp graphs run by the DTensor re-trace instead of on the captured graph (reason)")
RUN_REPLICATED = counters.counter("ops of a lifted tp graph DTensor could not place, run replicated (op, error)")
_COL, _ROW = 0, 1


class NotLifted(Exception):
    """This graph cannot run tensor-parallel on its capture; the message says why."""


@torch.library.custom_op("colauto::tp_pin", mutates_args=())
def tp_pin(x: torch.Tensor, kind: int) -> torch.Tensor:
    """Where tensor parallelism moves an activation (see the module docstring); the identity outside it."""
    return x.clone()


@tp_pin.register_fake
def _(x, kind):
    return torch.empty_like(x)


def _pin_vmap(info, in_dims, x, kind):
    # only values that hold the ranks' micro-batches move; the lifted graph's pins see the stack dim first,
    # where the interpreter expects it
    if in_dims[0] is None:
        return x.clone(), None
    return tp_pin(x.movedim(in_dims[0], 0), kind), 0


tp_pin.register_vmap(_pin_vmap)


def pin(captured: fx.GraphModule, names: dict[int, str], plan: ParallelPlan) -> tuple[fx.GraphModule, int]:
    """A copy of the captured graph with the plan's tp pins in it, and how many: a column linear's input
    gathered over tp, a row linear's output reduce-scattered to batch shards; where the plan places layers
    (`layer_places`), every value entering a placed layer moved to its place ("R": gathered over tp, "S":
    batch-sharded), and every value leaving the last one batch-sharded (emit.py's hooks, as edges)."""
    from .strategy import _LINEAR, _layer
    graph = fx.Graph()
    graph.output(graph.graph_copy(captured.graph, {}))
    gm = fx.GraphModule(captured, graph)
    tp = [r for r, _ in plan.axes].index("tp")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    weight_of = {placeholders[i]: name for i, name in names.items()}
    count = 0

    def pinned(value: fx.Node, kind: int, before: fx.Node, made: dict) -> fx.Node:
        nonlocal count
        if (value, kind) not in made:
            with gm.graph.inserting_before(before):
                made[value, kind] = gm.graph.call_function(torch.ops.colauto.tp_pin.default, (value, kind))
            count += 1
        return made[value, kind]
    if plan.layer_places:
        places, made = plan.layer_places, {}
        for n in list(gm.graph.nodes):
            if n.op not in ("call_function", "call_method", "call_module"):
                continue
            here = _layer(n)
            for a in n.all_input_nodes:
                if a in weight_of or a.op == "get_attr":
                    continue
                there = _layer(a) if a.op != "placeholder" else None
                if there == here:
                    continue
                place = places.get(here) or ("S" if there in places else None)
                if place is not None:
                    n.replace_input_with(a, pinned(a, _COL if place == "R" else _ROW, n, made))
    gathered: dict = {}       # one gather of an input that several column linears read (q, k, v)
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target not in _LINEAR or len(n.args) < 2:
            continue
        spec = plan.compute.get(weight_of.get(n.args[1], ""))
        if spec is None:
            continue
        if spec[tp] == "S0":          # column: its input gathered over tp
            n.update_arg(0, pinned(n.args[0], _COL, n, gathered))
        elif spec[tp] == "S1":        # row: its partial output back to batch shards
            with gm.graph.inserting_after(n):
                p = gm.graph.call_function(torch.ops.colauto.tp_pin.default, (n, _ROW))
            n.replace_all_uses_with(p, delete_user_cb=lambda u: u is not p)
            count += 1
    gm.graph.lint()
    gm.recompile()
    return gm, count


def lift(gm: fx.GraphModule, inputs: list, stacked: list[bool], world: int) -> fx.GraphModule:
    """`gm` over a leading dim of `world` entries for the inputs marked `stacked` (an aten graph)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    in_dims = tuple(0 if s else None for s in stacked)

    def one(*args):
        out = gm(*args)
        return tuple(out) if isinstance(out, (list, tuple)) else (out,)
    lifted = torch.func.vmap(one, in_dims=in_dims, randomness="different")
    try:
        graph = make_fx(lifted, tracing_mode="fake")(*_fakes(inputs, [world if s else None for s in stacked]))
    except Exception as exc:   # noqa: BLE001 - any failure to lift sends the plan to the DTensor path
        raise NotLifted(f"vmap cannot lift it: {_first_line(exc)}") from exc
    _split_multi_dim_squeezes(graph)
    return graph


def _split_multi_dim_squeezes(gm: fx.GraphModule) -> None:
    """`aten.squeeze.dims(x, dims)` (vmap writes it) as one `squeeze.dim` per dim, highest first: torch 2.11's
    DTensor has no rule for the several-dims form (HF Llama's lifted graph then went to the DTensor path)."""
    aten = torch.ops.aten
    for n in list(gm.graph.nodes):
        if n.op == "call_function" and n.target is aten.squeeze.dims:
            x, dims = n.args[0], n.args[1]
            rank = n.args[0].meta["val"].dim() if "val" in n.args[0].meta else None
            if rank is None:
                continue
            with gm.graph.inserting_before(n):
                for d in sorted({d % rank for d in dims}, reverse=True):
                    x = gm.graph.call_function(aten.squeeze.dim, (x, d))
            n.replace_all_uses_with(x)
            gm.graph.erase_node(n)
    gm.graph.lint()
    gm.recompile()


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"


def _fakes(inputs: list, stack: list) -> list:
    """Fake tensors like `inputs` in a fake mode of their own (`stack[i]`: a leading dim of that many entries
    for input i, or None), requiring gradients as the inputs do: kernels are chosen by it (CPU flash attention
    has no gradient for a mask: T5's position bias)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    out = []
    with compat.outside_fake_mode(), FakeTensorMode():
        for t, n in zip(inputs, stack):
            if isinstance(t, torch.Tensor):
                t = (torch.empty((n, *t.shape), dtype=t.dtype, device=t.device) if n else
                     torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)).requires_grad_(t.requires_grad)
            out.append(t)
    return out


class _Mean(torch.autograd.Function):
    """Identity; its backward divides the gradient by the world: a parameter's gradient is the mean over the
    ranks' micro-batches, as DDP's, while each rank's outputs are its own."""

    @staticmethod
    def forward(ctx, x, world):
        ctx.world = world
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad / ctx.world, None


class _OnDTensors(fx.Interpreter):
    """Runs the lifted graph with DTensor values: pins redistribute over tp; a plain tensor an op makes (a
    factory: positions, masks) is the same on every rank, so replicated."""

    def __init__(self, gm, mesh, tp: int, replicated: set):
        super().__init__(gm)
        self.mesh, self.tp, self.replicated = mesh, tp, replicated

    def call_function(self, target, args, kwargs):
        if target is torch.ops.colauto.tp_pin.default:
            x, kind = args
            if not isinstance(x, DTensor):
                return x
            place = Replicate() if kind == _COL else Shard(0)
            return x.redistribute(self.mesh, [place if i == self.tp else p for i, p in enumerate(x.placements)])
        try:
            out = super().call_function(target, args, kwargs)
        except Exception as exc:  # noqa: BLE001 - DTensor has no placement for this op here: run it replicated
            if not isinstance(target, torch._ops.OpOverload) or not any(
                    isinstance(a, DTensor) for a in pytree.tree_leaves((args, kwargs))):
                raise
            self.replicated.add(f"{target} ({type(exc).__name__})")
            whole = lambda a: (a.redistribute(self.mesh, [Replicate()] * self.mesh.ndim)   # noqa: E731
                               if isinstance(a, DTensor) else a)
            args, kwargs = pytree.tree_map(whole, (args, kwargs))
            try:
                out = super().call_function(target, args, kwargs)
            except Exception:  # noqa: BLE001 - no rule even replicated (torch 2.11: aten.squeeze.dims): run it
                # on the whole tensors, which every rank holds; the result is replicated
                local = lambda a: a.to_local() if isinstance(a, DTensor) else a   # noqa: E731
                out = super().call_function(target, *pytree.tree_map(local, (args, kwargs)))
        return self._replicated(out)

    def _replicated(self, out):
        if isinstance(out, torch.Tensor) and not isinstance(out, DTensor):
            return DTensor.from_local(out, self.mesh, [Replicate()] * self.mesh.ndim, run_check=False)
        if isinstance(out, (list, tuple)):
            return type(out)(self._replicated(o) for o in out)
        return out


def _runner(lifted: fx.GraphModule, kinds: list, mesh, tp: int, world: int, outputs: list,
            replicated: set) -> fx.GraphModule:
    """A graph module over the rank's local inputs (parameter shards, buffers, its micro-batch) that runs
    `lifted` on DTensors and returns the rank's own outputs; `kinds[i]`: ("param", storage, compute, shape,
    stride) | ("state",) | ("stacked",) | ("value",)."""
    every = [Shard(0)] * mesh.ndim

    def run(*local):
        args = []
        for t, kind in zip(local, kinds):
            if kind[0] == "param":
                _, storage, compute, shape, stride = kind
                d = DTensor.from_local(_Mean.apply(t, world), mesh, storage, run_check=False,
                                       shape=torch.Size(shape), stride=stride)
                args.append(d.redistribute(mesh, compute))
            elif kind[0] == "state":
                args.append(DTensor.from_local(t, mesh, [Replicate()] * mesh.ndim, run_check=False))
            elif kind[0] in ("own state", "stacked"):
                # the rank's entry of the stack; a buffer's is a view of it, so an update in place reaches it
                t = t if kind[0] == "own state" else t.contiguous()
                args.append(DTensor.from_local(t.unsqueeze(0), mesh, every, run_check=False,
                                               shape=torch.Size((world, *t.shape)), stride=(t.numel(), *t.stride())))
            else:
                args.append(t)
        outs = _OnDTensors(lifted, mesh, tp, replicated).run(*args)
        return tuple(o.redistribute(mesh, every).to_local().squeeze(0) if isinstance(o, DTensor) else o
                     for o in outs)

    graph = fx.Graph()
    placeholders = [graph.placeholder(f"arg{i}") for i in range(len(kinds))]
    result = graph.call_function(run, tuple(placeholders))
    leaves = []
    for k, example in enumerate(outputs):
        leaf = graph.call_function(operator.getitem, (result, k))
        leaf.meta["example_value"] = example
        leaves.append(leaf)
    graph.output(tuple(leaves))
    return fx.GraphModule(torch.nn.Module(), graph)


def unsupported(gm: fx.GraphModule, example_inputs: list, plan: ParallelPlan) -> str | None:
    """Why this path does not take this graph (None: it tries)."""
    if any(not isinstance(t, torch.Tensor) for t in example_inputs):
        return "the graph has symbolic sizes"
    mesh = fsdp.built_mesh(plan.axes) if fsdp.reads_cut(example_inputs) else None
    if mesh is not None and any(fsdp._FULL[t].mesh is not mesh for t in example_inputs
                                if isinstance(t, torch.nn.Parameter) and fsdp.is_cut(t)):
        return "it reads a parameter an earlier graph cut over another mesh"
    return None


def compile(gm: fx.GraphModule, example_inputs: list, plan: ParallelPlan, make_local: Callable) -> Callable:
    """The captured graph run tensor-parallel (see the module docstring), compiled by `make_local(dp)`;
    raises NotLifted before anything is changed where it cannot."""
    from .entry import state_names, owner_module, _checked_gradients, _live_modules  # entry imports this module
    reason = unsupported(gm, example_inputs, plan)
    if reason is not None:
        raise NotLifted(reason)
    import torch.distributed as dist
    names = state_names(gm)
    roles = [r for r, _ in plan.axes]
    tp = roles.index("tp")
    mesh = fsdp.built_mesh(plan.axes)
    world = dist.get_world_size()
    dp = data.DataParallel.world_group()
    data.prepare(gm, example_inputs, dp)          # rank 0's values everywhere, before any is cut
    outputs = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    out_examples = [o.meta.get("example_value") if isinstance(o, fx.Node) else o
                    for o in (outputs if isinstance(outputs, (list, tuple)) else [outputs])]
    from .emit import activations_on_dtensors, placements_of
    activations_on_dtensors(plan)
    pinned, pins = pin(gm, names, plan)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    stacked = [isinstance(t, torch.Tensor) and i not in names for i, t in enumerate(example_inputs)]
    try:
        lifted = lift(pinned, example_inputs, stacked, world)
    except NotLifted as first:
        # a buffer the graph updates in place from the micro-batch (BatchNorm's running statistics): each
        # rank keeps its own, as under DDP, stacked with the micro-batches
        own = [s or (isinstance(t, torch.Tensor) and i in names and not isinstance(t, torch.nn.Parameter))
               for i, (s, t) in enumerate(zip(stacked, example_inputs))]
        if own == stacked:
            raise
        try:
            lifted, stacked = lift(pinned, example_inputs, own, world), own
        except NotLifted:
            raise first from None
    kinds, inputs, cuts, cut_before = [], list(example_inputs), [], []
    for i, t in enumerate(example_inputs):
        name = names.get(i)
        if isinstance(t, torch.nn.Parameter):
            compute = placements_of(plan.compute.get(name, ("R",) * len(roles)))
            cut = fsdp._FULL.get(t)
            if cut is not None:     # cut by an earlier graph (a no_grad call first): read as it was cut
                kinds.append(("param", list(cut.placements), compute, cut.shape, cut.stride))
                inputs[i] = compat.fake_parameter_like(fsdp._STASH.get(t, t.data), t.requires_grad)
                cut_before.append(placeholders[i])
                continue
            storage = placements_of(plan.storage.get(name, ("R",) * len(roles)))
            kinds.append(("param", storage, compute, tuple(t.shape), t.stride()))
            if any(not isinstance(p, Replicate) for p in storage):
                local = compat.local_piece(t.detach(), mesh, storage)
                inputs[i] = compat.fake_parameter_like(local, t.requires_grad)
                cuts.append((i, storage))
        elif name is not None:
            kinds.append(("own state",) if stacked[i] else ("state",))
        elif stacked[i]:
            kinds.append(("stacked",))
        else:
            kinds.append(("value",))
    compat.guard_parameters_by_identity(cut_before)
    replicated: set[str] = set()      # ops DTensor could not place, run replicated (counted once compiled)
    runner = _runner(lifted, kinds, mesh, tp, world, out_examples, replicated)
    try:
        # the forward on fake tensors first, outside Dynamo's tracing context: where DTensor cannot run an op,
        # that compile would fail half-way, and the DTensor path's compile after it failed too (T5 under
        # codegen inductor: "Node tangents_2 was invalid")
        from torch.fx.experimental.proxy_tensor import make_fx
        with _dtensor_rules.default_batch_norm():
            make_fx(runner, tracing_mode="fake")(*_fakes(inputs, [None] * len(inputs)))
    except Exception as exc:   # noqa: BLE001 - DTensor could not run it: the DTensor path runs the plan
        raise NotLifted(f"DTensor cannot run the lifted graph: {_first_line(exc)}") from exc
    try:
        with _dtensor_rules.default_batch_norm():   # each rank's micro-batch is normalized alone already
            compiled = make_local(data.DataParallel(dp.world, dp.group_name, reduce_grads=False))(runner, inputs)
    except Exception as exc:   # noqa: BLE001 - its backward: DTensor could not run it either
        raise NotLifted(f"DTensor cannot run the lifted graph's backward: "
                        f"{_first_line(compat.unwrap_backend_error(exc))}") from exc
    for op in sorted(replicated):
        RUN_REPLICATED[op] += 1
    # compiled: now the parameters are cut in place (nothing changed before this point)
    compat.on_dynamo_compile(fsdp._standins_on, fsdp._standins_off)
    compat.guard_parameters_by_identity([placeholders[i] for i, _ in cuts])
    for i, storage in cuts:
        p = example_inputs[i]
        fsdp.cut_in_place(p, compat.local_piece(p.detach(), mesh, storage), mesh, tuple(storage))
        fsdp.SHARDED[names[i]] += 1
    LIFTED[plan.mesh_str] += 1
    if report._rank() == 0:
        print(f"colauto: tp on the captured graph: {len(cuts)} parameters cut in place over {plan.mesh_str}, "
              f"{pins} tp pins, the graph lifted over {world} ranks", flush=True)
    live = _live_modules() if cuts else None   # one scan of the objects for both lookups
    if cuts:
        fsdp._expose_as_dtensors(owner_module(gm, example_inputs, live))
    fsdp._standins_off()
    return _checked_gradients(gm, example_inputs, compiled, live)
