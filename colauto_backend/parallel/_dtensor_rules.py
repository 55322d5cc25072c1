"""DTensor's own sharding rules, asked before tracing and without data: how DTensor runs an op sharded
(`rule_kind`), which output placements and input redistributions it would choose (`propagate`), which
ops of an aten graph it has no rule for (`uncovered`), and the rule colauto gives those: run replicated
(`run_replicated`: every tensor input redistributed to Replicate, the op run whole on each rank, its
outputs Replicate), a redistributed local tensor laid out as its global strides say
(`keep_local_layout`), CPU flash attention sharded on batch or heads (`shard_cpu_attention`: DTensor has no
rule), masks of CUDA's fused attention placed by their shape (`shard_attention_masks`), and
padding sharded along the dims it leaves alone (`shard_padding`, torch 2.11's rule is a one-dim stub), and
BatchNorm run on each rank's part of the batch (`batch_norm_per_rank`). The one place colauto reads DTensor's private sharding-propagation registries and
redistribution (torch 2.11-2.13); a torch upgrade edits this file."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch.utils import _pytree as pytree

from .. import counters
from .._torch_compat import example_int

_REGISTRIES = ("op_to_rules", "op_strategy_funcs", "op_single_dim_strategy_funcs")


@functools.cache
def _dtensor() -> SimpleNamespace:
    """DTensor's dispatcher and propagator; a missing private API is a one-line error naming it."""
    try:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import DTensor, Replicate
        from torch.distributed.tensor._decompositions import DecompShardingStrategy
        from torch.distributed.tensor._dtensor_spec import DTensorSpec
        dispatcher = DTensor._op_dispatcher
        prop = dispatcher.sharding_propagator
        for name in _REGISTRIES + ("propagate_op_sharding_non_cached",):
            getattr(prop, name)
        for name in ("_custom_op_handlers", "unwrap_to_op_info"):
            getattr(dispatcher, name)
        DecompShardingStrategy.has_decomp
    except (ImportError, AttributeError) as e:
        raise RuntimeError(f"colauto: torch {torch.__version__} lacks a DTensor sharding-propagation API colauto "
                           f"reads ({e}): adapt colauto_backend/parallel/_dtensor_rules.py to it") from None
    return SimpleNamespace(DTensor=DTensor, Spec=DTensorSpec, Mesh=DeviceMesh, Replicate=Replicate,
                           dispatcher=dispatcher, prop=prop, has_decomp=DecompShardingStrategy.has_decomp)


def _is_cia(op: torch._ops.OpOverload) -> bool:
    """CompositeImplicitAutograd: the dispatcher decomposes it before DTensor sees it (the check DTensor's
    own dispatcher makes)."""
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), torch._C.DispatchKey.CompositeImplicitAutograd)
    except RuntimeError:        # Python-only overloads (aten.__and__.bool) have no dispatcher entry
        return False


def rule_kind(op: torch._ops.OpOverload) -> str | None:
    """How DTensor runs `op` on sharded inputs, in its dispatcher's order: "handler" (a hand-written
    dispatcher case, e.g. convolution; `propagate` refuses these), "strategy" (op_strategy_funcs /
    op_single_dim_strategy_funcs), "custom" (register_sharding), "rule" (op_to_rules), "composite implicit"
    (decomposed before DTensor sees it), "decomposition" (DTensor traces its decomposition), "replicated"
    (colauto's fallback, `run_replicated`), or None: DTensor cannot run it sharded."""
    d = _dtensor()
    if op in d.dispatcher._custom_op_handlers:
        return "handler"
    if op in d.prop.op_single_dim_strategy_funcs:
        return "strategy"
    fn = d.prop.op_strategy_funcs.get(op)
    if fn is not None:
        # register_sharding stores partial(custom_strategy, user_fn), custom_strategy being its local function
        is_custom = isinstance(fn, functools.partial) and fn.func.__qualname__.startswith("register_sharding.")
        if is_custom and fn.args and isinstance(fn.args[0], functools.partial) and fn.args[0].func is _replicate_all:
            return "replicated"
        return "custom" if is_custom else "strategy"
    if op in d.prop.op_to_rules:
        return "rule"
    if _is_cia(op):
        return "composite implicit"
    try:
        return "decomposition" if d.has_decomp(op) else None
    except RuntimeError:
        return None


@dataclass(frozen=True)
class Sharding:
    """What DTensor would do. `out`: each output's placements (None: not a tensor); `redistribute`:
    (tensor input index, from placements, to placements) for each input it would redistribute first."""
    out: tuple[tuple | None, ...]
    redistribute: tuple[tuple[int, tuple, tuple], ...]


def propagate(op: torch._ops.OpOverload, args, kwargs, placements, mesh) -> Sharding:
    """DTensor's choice for `op(*args, **kwargs)`. The tensors in args/kwargs (meta, fake or real; only their
    shapes, strides and dtypes are read) get `placements[i]` (one Placement per mesh dim), in pytree order of
    (args, kwargs). No communication: any mesh works, one of a fake process group included. This is DTensor's
    decision; whether it can run each redistribution is not checked (torch 2.11 cannot run Shard -> Partial)."""
    d = _dtensor()
    handler = d.dispatcher._custom_op_handlers.get(op)
    if handler is not None:     # e.g. convolution's runs the op locally without the propagator's redistributions
        raise NotImplementedError(f"colauto: DTensor runs {op} through its own handler {handler.__name__}, not its "
                                  "sharding propagation: its placements cannot be predicted")
    kwargs = dict(kwargs or {})
    n = sum(isinstance(t, torch.Tensor) for t in pytree.tree_leaves((args, kwargs)))
    if len(placements) != n:
        raise ValueError(f"colauto: {op} has {n} tensor arguments but {len(placements)} placements were given: "
                         "give one per tensor, in argument order")
    given = iter(placements)

    def as_dtensor(t: torch.Tensor):
        # a meta local of the global size: propagation reads only the global shape/stride/dtype in the spec
        shape, stride = torch.Size(_hint(op, s) for s in t.shape), tuple(_hint(op, s) for s in t.stride())
        local = torch.empty_strided(shape, stride, dtype=t.dtype, device="meta")
        return d.DTensor.from_local(local, mesh, tuple(next(given)), run_check=False, shape=shape, stride=stride)

    args, kwargs = pytree.tree_map_only(torch.Tensor, as_dtensor, (tuple(args), kwargs))
    info = d.dispatcher.unwrap_to_op_info(op, args, kwargs)     # DTensor's own OpSchema for this call
    try:
        # uncached: planner queries should not fill DTensor's runtime cache
        sharding = d.prop.propagate_op_sharding_non_cached(info.schema)
    except NotImplementedError as e:
        raise NotImplementedError(f"colauto: DTensor cannot propagate {op} (rule kind: {rule_kind(op)}): "
                                  f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    spec = sharding.output_spec
    outs = spec if isinstance(spec, (tuple, list)) else (spec,)
    redistribute = ()
    if sharding.needs_redistribute and sharding.redistribute_schema is not None:
        before, after = _specs(d, info.schema), _specs(d, sharding.redistribute_schema)
        if len(before) != len(after):
            raise RuntimeError(f"colauto: DTensor's redistribution for {op} names {len(after)} tensors, the call "
                               f"has {len(before)}: adapt colauto_backend/parallel/_dtensor_rules.py")
        redistribute = tuple((i, tuple(a.placements), tuple(b.placements))
                             for i, (a, b) in enumerate(zip(before, after)) if a.placements != b.placements)
    return Sharding(tuple(None if s is None else tuple(s.placements) for s in outs), redistribute)


def _hint(op, size) -> int:
    """A size's example value. Symbolic sizes (a dynamic graph's fake values) are answered at their hints
    without guarding: DTensor's decomposition trace fails inside the graph's fake mode (prim::device)."""
    try:
        return example_int(size)
    except TypeError:           # an unbacked size has no hint
        raise ValueError(f"colauto: {op} has a size {size} with no example value (data-dependent): "
                         "DTensor's rules cannot be asked before it is known") from None


def _specs(d: SimpleNamespace, schema) -> list:
    return [s for s in pytree.tree_leaves((schema.args_schema, schema.kwargs_schema)) if isinstance(s, d.Spec)]


# BatchNorm's training ops (the graph's functional one, and those DTensor sees while the model is traced)
# and its backward, which `batch_norm_per_rank` runs on each rank's own part of the batch
_BATCH_NORM = ("aten._native_batch_norm_legit.default", "aten._native_batch_norm_legit.no_stats",
               "aten._native_batch_norm_legit_functional.default", "aten.native_batch_norm.default",
               "aten._batch_norm_with_update.default")
_BATCH_NORM_BACKWARD = "aten.native_batch_norm_backward.default"


def batch_norm_per_rank() -> None:
    """From now on, DTensor runs BatchNorm on each rank's part of the batch: its statistics are those of the
    rank's micro-batch, as under dp, fsdp, DDP and colauto's first (unplanned) call. DTensor's own rule
    shards BatchNorm on channels, which normalizes the whole global batch: HF ResNet under tp=2 then
    trained on global statistics from its second step on and on per-rank ones in its first, matching
    neither reference (2.101 / 1.946 against the micro-batches' 2.056 / 1.930 and the global batch's
    2.053 / 1.893). The input goes to Shard(0) on every mesh dim (a local slice where it was replicated:
    the global batch is the ranks' micro-batches in rank order); the output stays there; the statistics
    saved for the backward are the rank's own (Partial(avg) placements, read back as local values by the
    backward handler); the running statistics are averaged over the ranks, so the buffers stay replicated
    (DDP keeps rank 0's). The backward returns batch-sharded input gradients and Partial(sum) weight and
    bias gradients, which the gradient reduction sums as for any weight read by batch-sharded activations."""
    d = _dtensor()
    for name in _BATCH_NORM:
        d.dispatcher._custom_op_handlers[op_named(name)] = _batch_norm_forward
    d.dispatcher._custom_op_handlers[op_named(_BATCH_NORM_BACKWARD)] = _batch_norm_backward


@contextlib.contextmanager
def default_batch_norm():
    """Within: DTensor's own BatchNorm rule, not `batch_norm_per_rank`'s. A graph lifted over the ranks
    (parallel/tp_graph.py) already normalizes each rank's micro-batch on its own (vmap folds the ranks' stack
    into the channels), where the per-rank rule would cut each micro-batch's rows apart instead."""
    d = _dtensor()
    handlers = d.dispatcher._custom_op_handlers
    ops = [op_named(name) for name in (*_BATCH_NORM, _BATCH_NORM_BACKWARD)]
    saved = {op: handlers.pop(op) for op in ops if op in handlers}
    try:
        yield
    finally:
        handlers.update(saved)


def normalizes_batches(gm: torch.fx.GraphModule) -> bool:
    """Whether a graph runs BatchNorm: `F.batch_norm` in Dynamo's graph, or its training ops in an aten graph
    (evaluation mode counts too: Dynamo's graph does not say which)."""
    functions = {torch.nn.functional.batch_norm, torch.batch_norm}
    ops = {op_named(name) for name in _BATCH_NORM}
    return any(n.op == "call_function" and (n.target in functions or n.target in ops) for n in gm.graph.nodes)


def _per_rank_placements(mesh):
    from torch.distributed.tensor import Partial, Replicate, Shard
    n = mesh.ndim
    return (Shard(0),) * n, (Replicate(),) * n, (Partial("avg"),) * n, (Partial("sum"),) * n


def _local(t, mesh, placements):
    """The local tensor of `t` redistributed to `placements` (a plain tensor or None as it is); a Partial
    DTensor (statistics `_batch_norm_forward` saved) gives its rank's own value."""
    d = _dtensor()
    if not isinstance(t, d.DTensor):
        return t
    if any(p.is_partial() for p in t.placements):
        return t._local_tensor
    return t.redistribute(mesh, placements)._local_tensor


def _batched(local: torch.Tensor, like, mesh, placements):
    d = _dtensor()
    if like.shape[0] % mesh.size():
        raise ValueError(f"colauto: BatchNorm under a mesh of {mesh.size()} ranks needs a batch they divide, got "
                         f"{like.shape[0]}: feed each rank the same micro-batch size")
    return d.DTensor.from_local(local, mesh, placements, run_check=False)


def _batch_norm_forward(op_call, args, kwargs):
    d = _dtensor()
    x = args[0]
    mesh = x.device_mesh
    batch, whole, own, _ = _per_rank_placements(mesh)
    has_stats = op_call._overloadname != "no_stats"
    local = [_local(a, mesh, batch if i == 0 else whole) for i, a in enumerate(args)]
    functional = op_call._schema.name.endswith("_functional")
    stats = (3, 4) if has_stats and local[3] is not None else ()
    for i in stats if not functional else ():
        local[i] = local[i].clone()        # updated in place by the op, averaged below, then written back
    outs = list(op_call(*local, **kwargs))
    result = [_batched(outs[0], x, mesh, batch)] + [d.DTensor.from_local(o, mesh, own, run_check=False)
                                                   for o in outs[1:3]]
    averaged = [d.DTensor.from_local(o, mesh, own, run_check=False).redistribute(mesh, whole)
                for o in (outs[3:5] if functional else [local[i] for i in stats])]
    if functional:
        result += averaged
    else:
        result += [d.DTensor.from_local(o, mesh, whole, run_check=False) for o in outs[3:]]   # cuDNN's reserve
        for i, new in zip(stats, averaged):
            args[i].copy_(new if isinstance(args[i], d.DTensor) else new._local_tensor)
    return tuple(result)


def _batch_norm_backward(op_call, args, kwargs):
    d = _dtensor()
    mesh = args[1].device_mesh if isinstance(args[1], d.DTensor) else args[0].device_mesh
    batch, whole, _, summed = _per_rank_placements(mesh)
    local = [_local(a, mesh, batch if i < 2 else whole) for i, a in enumerate(args)]
    grad_input, grad_weight, grad_bias = op_call(*local, **kwargs)
    like = args[1]
    return (None if grad_input is None else _batched(grad_input, like, mesh, batch),
            *(None if g is None else d.DTensor.from_local(g, mesh, summed, run_check=False)
              for g in (grad_weight, grad_bias)))


def uncovered(gm: torch.fx.GraphModule) -> dict[str, list[torch.fx.Node]]:
    """The ops of an aten graph that DTensor has no sharding rule for (or only colauto's replicated
    fallback), each named once, in graph order, with the
    nodes that call it. Ops with no tensor input run as plain tensor ops and are skipped. An op DTensor
    handles by tracing its decomposition counts only if that trace succeeds on the node's example values
    (replicated)."""
    missing: dict[str, list[torch.fx.Node]] = {}
    for node in gm.graph.nodes:
        op = node.target
        if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload):
            continue
        if str(op) in missing:
            missing[str(op)].append(node)
            continue
        inputs = [a for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, torch.fx.Node)]
        if not any("val" not in a.meta or isinstance(a.meta["val"], torch.Tensor) for a in inputs):
            continue
        kind = rule_kind(op)
        if (kind in (None, "replicated")
                or (kind == "decomposition" and not _decomposes(op, node))):
            missing[str(op)] = [node]
    return missing


def replicable(op: torch._ops.OpOverload) -> bool:
    """Whether `run_replicated` can give `op` a rule: a functional op (no argument it mutates or aliases)
    whose tensors are single Tensor arguments and returns (a Tensor list is not a placement DTensor's
    generic strategy expands)."""
    schema = op._schema
    if schema.is_mutable or any(a.alias_info is not None for a in schema.arguments):
        return False
    tensor, opt_tensor = torch.TensorType.get(), torch.OptionalType(torch.TensorType.get())
    def plain(t) -> bool:
        return t == tensor or t == opt_tensor or not _holds_tensor(t)
    return (all(plain(a.type) for a in schema.arguments)
            and all(r.type == tensor for r in schema.returns) and len(schema.returns) > 0)


def _holds_tensor(t) -> bool:
    return "Tensor" in str(t)


def _replicate_all(n_out: int, *args, **kwargs) -> list:
    """The one strategy `run_replicated` registers: every output and every tensor input Replicate."""
    from torch.distributed.tensor import Replicate
    spec = _dtensor().Spec
    for name, a in kwargs.items():    # DTensor never redistributes keyword arguments
        if isinstance(a, spec) and any(p != Replicate() for p in a.placements):
            raise NotImplementedError(f"colauto: keyword argument {name} arrives sharded ({a.placements}) at an op "
                                      "run replicated, and DTensor does not redistribute keyword arguments")
    inputs = [Replicate() if isinstance(a, spec) else None for a in (*args, *kwargs.values())]
    return [([Replicate()] * n_out, inputs)]


def op_named(name: str) -> torch._ops.OpOverload:
    """The op an OpOverload's str() names ("aten.fill.Tensor", "transformers.grouped_mm_fallback.default")."""
    namespace, packet, overload = name.rsplit(".", 2)
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


def run_replicated(op: torch._ops.OpOverload) -> None:
    """Give `op`, which DTensor has no rule for, colauto's fallback rule (DTensor's register_sharding):
    its sharded inputs are gathered (Partial ones reduced), it runs whole on every rank and its outputs
    are Replicate. Correct for any op; its cost is the gathers, which the planner adds to tp plans.

    Its in-place variant (`fill_.Tensor` for `fill.Tensor`), where DTensor has no rule for that either,
    gets a handler that runs the functional op so and writes the rank's part of the result back into
    the input: left to DTensor, the in-place op is decomposed into the functional one and a `copy_`
    into the gathered copy, and the write is silently lost (BART's `shift_tokens_right` under tp)."""
    if rule_kind(op) == "replicated":
        return
    if not replicable(op):
        raise ValueError(f"colauto: {op} mutates an input or takes or returns a list of tensors: it cannot be "
                         "run replicated by a generic rule")
    _register_sharding(op, functools.partial(_replicate_all, len(op._schema.returns)))
    inplace = _inplace_variant(op)
    if inplace is not None and rule_kind(inplace) in (None, "decomposition"):
        _dtensor().dispatcher._custom_op_handlers[inplace] = functools.partial(_write_back, op)


def _inplace_variant(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """`aten.fill_.Tensor` for `aten.fill.Tensor`; None where there is none."""
    namespace, name = op._schema.name.split("::")
    packet = getattr(getattr(torch.ops, namespace), name + "_", None)
    return None if packet is None else getattr(packet, op._overloadname, None)


def _write_back(functional: torch._ops.OpOverload, op_call, args, kwargs):
    """DTensor handler of an in-place op with no rule: its functional op (run replicated), then the
    rank's part of the result copied into the input, in the input's placements."""
    d = _dtensor()
    target = args[0]
    if not isinstance(target, d.DTensor):
        raise NotImplementedError(f"colauto: {op_call} writes into a plain tensor but reads a DTensor: give it a "
                                  "sharding rule with torch.distributed.tensor.experimental.register_sharding")
    result = functional(*args, **kwargs)
    target.copy_(result.redistribute(target.device_mesh, target.placements))
    return target


def _decomposes(op: torch._ops.OpOverload, node: torch.fx.Node) -> bool:
    """Whether DTensor's decomposition trace covers `op`: one replicated propagation on a one-device mesh
    that needs no process group (the mesh DTensor's own decomposition trace uses)."""
    if any("val" not in a.meta for a in node.all_input_nodes):
        return True                                  # no example values: trust the registry
    args, kwargs = pytree.tree_map_only(torch.fx.Node, lambda a: a.meta["val"], (node.args, node.kwargs))
    d = _dtensor()
    mesh = d.Mesh("cpu", [0], _init_backend=False, _rank=0)
    n = sum(isinstance(t, torch.Tensor) for t in pytree.tree_leaves((args, kwargs)))
    try:
        propagate(op, args, kwargs, [(d.Replicate(),)] * n, mesh)
    except NotImplementedError:
        return False
    return True


def shard_cpu_attention() -> None:
    """DTensor has no sharding rule for CPU flash attention: shard it on batch or heads (all inputs and
    outputs alike), as its CUDA rule does."""
    from torch.distributed.tensor import Replicate, Shard
    aten = torch.ops.aten

    def rules(n_in: int, n_out: int, mask) -> list:
        # the mask is a keyword argument, which DTensor never redistributes: each strategy keeps it in the
        # placement it has (T5's position bias [1, heads, q, k] sharded on heads as q is, or replicated
        # where it broadcasts over the sharded dim); a strategy that would need it moved is left out
        def keep(place) -> list | None:
            if mask is None:
                return []
            if all(p == place for p in mask.placements):
                return [place]
            if all(p == Replicate() for p in mask.placements) and place != Replicate() and mask.shape[place.dim] == 1:
                return [Replicate()]
            return None
        out = []
        for place in (Replicate(), Shard(0), Shard(1)):
            m = keep(place)
            if m is not None:
                out.append(([place] * n_out, [place] * n_in + [None, None] + m))
        return out

    def _fwd(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
        return rules(3, 2, attn_mask)

    def _bwd(g, q, k, v, o, lse, dropout_p, is_causal, *, attn_mask=None, scale=None):
        return rules(6, 3, attn_mask)
    _register_sharding(aten._scaled_dot_product_flash_attention_for_cpu.default, _fwd)
    _register_sharding(aten._scaled_dot_product_flash_attention_for_cpu_backward.default, _bwd)


def shard_padding() -> None:
    """constant_pad_nd (HF's loss pads the labels by one position): shard any dim that is not padded, as
    torch 2.13's rule does. Torch 2.11's rule is a stub for one-dim meshes (every input Replicate): on a
    2-D mesh DTensor's redistribution planner fails with "list index out of range" (HF Llama 8B's labels,
    Shard(0) over dp and tp, on 4 H200s). Installed only where DTensor has no rule of its own for one mesh
    dim (`op_single_dim_strategy_funcs`, torch 2.13)."""
    _register_missing(torch.ops.aten.constant_pad_nd.default, _padding)


def shard_batch_norm_backward() -> None:
    """BatchNorm's backward sharded on channels, as torch 2.13's DTensor rule has it (`_math_ops`'s
    batch_norm_backward_strategy: the backward reduces over the batch and spatial dims, which channel
    shards leave whole), or replicated. DTensor 2.11 has no rule for it, and 2.12 derives one by tracing
    the op's decomposition for every placement of its seven tensor inputs: HF ResNet under tp=2, whose
    lifted graph runs DTensor's own BatchNorm rules (`default_batch_norm`), took 940 s in a torch 2.12
    suite run, against seconds on 2.13. Installed only where DTensor has no rule of its own for one mesh
    dim (2.13's). `batch_norm_per_rank`'s handler, where installed, runs before any rule."""
    _register_missing(op_named(_BATCH_NORM_BACKWARD), _by_channel)


def convolution_weight_grads_replicated_where_the_input_is() -> None:
    """The weight and bias gradients of convolution_backward Partial only over the mesh dims that shard its
    input (batch or width: each rank's gradient is then a part of the sum) and Replicate over the others,
    as torch 2.13's DTensor rule has them. Torch 2.11's rule marks them Partial over mesh dim 0 whatever the
    input, so a convolution that runs replicated over tp had its weight gradient summed over the ranks:
    HF ConvNeXt under tp=2 trained with its convolutions' gradients doubled, silently (CPU, gloo, 2
    processes; `bench/results/cpu-2026-12-07-torch2.11-parallel-matrix/`). Installed only where DTensor
    has no strategy of its own for the op (2.13 has one); DTensor's convolution handler runs it."""
    d = _dtensor()
    op = torch.ops.aten.convolution_backward.default
    rule = d.prop.op_to_rules.get(op)
    if (op in d.prop.op_single_dim_strategy_funcs or op in d.prop.op_strategy_funcs or rule is None
            or getattr(rule, "colauto_fixed", False)):
        return
    from torch.distributed.tensor import Partial, Replicate

    def placed_as_the_input(op_schema):
        sharding = rule(op_schema)
        specs = sharding.output_spec
        inp = op_schema.args_schema[1]
        if not isinstance(specs, (list, tuple)) or not hasattr(inp, "placements"):
            return sharding
        grads = tuple(Partial() if p.is_shard() else Replicate() for p in inp.placements)
        sharding.output_spec = [specs[0], *(None if s is None else d.Spec(s.mesh, grads, tensor_meta=s.tensor_meta)
                                            for s in specs[1:])]
        return sharding
    placed_as_the_input.colauto_fixed = True
    d.prop.op_to_rules[op] = placed_as_the_input
    CONV_GRADS_FIXED["torch " + torch.__version__.split("+")[0]] += 1


CONV_GRADS_FIXED = counters.counter(
    "DTensor rule of convolution_backward replaced: weight gradients Partial only where the input is sharded")


def index_put_never_sharded_on_an_indexed_dim() -> None:
    """index_put(self, indices, values) with `self` and `values` sharded only on the dims no index selects
    (the trailing ones, and the same dims of `values`, aligned from the end), as torch 2.13's DTensor rule
    has it. Torch 2.11's strategy (`prop_index_put`) takes `values`' leading dims for the indexed ones, so
    where `values` has as many dims as `self` it shards both on an indexed dim while the indices stay whole:
    HF Qwen2-MoE under dp=2,tp=2 (the experts' weights indexed by each rank's routing, lifted over the
    ranks) failed in its backward ("value tensor of shape [2, 64, 64] cannot be broadcast to indexing
    result of shape [4, 64, 64]", CPU, gloo, 4 processes;
    `bench/results/cpu-2026-12-07-torch2.11-parallel-matrix/`). Its strategies that do so are dropped
    (all replicated where none is left). Installed only over that function (2.13 has its own rule)."""
    d = _dtensor()
    aten = torch.ops.aten
    for op in (aten.index_put.default, aten._index_put_impl_.default):
        fn = d.prop.op_strategy_funcs.get(op)
        if (fn is None or op in d.prop.op_single_dim_strategy_funcs or getattr(fn, "colauto_fixed", False)
                or getattr(fn, "__name__", "") != "prop_index_put"):
            continue
        d.prop.op_strategy_funcs[op] = _index_put_checked(fn)
        INDEX_PUT_FIXED["torch " + torch.__version__.split("+")[0]] += 1


def _index_put_checked(strategy_fn):
    """`strategy_fn` (torch 2.11's index_put strategy) less its strategies that shard `self` or `values` on
    an indexed dim; all replicated where none is left."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._op_schema import OpSpec, OpStrategy
    from torch.distributed.tensor._ops.utils import generate_redistribute_costs
    d = _dtensor()

    def valid(spec, self_shape: tuple, values_shape: tuple, n_indexed: int) -> bool:
        for p_in, p_v in zip(spec.input_specs[0].placements, spec.input_specs[-1].placements):
            if not p_in.is_shard() and not p_v.is_shard():
                continue
            if not (isinstance(p_in, Shard) and isinstance(p_v, Shard)) or p_in.dim < n_indexed:
                return False
            v_dim = p_in.dim - len(self_shape) + len(values_shape)   # the same dim of values, from the end
            if p_v.dim != v_dim or v_dim < 0 or values_shape[v_dim] != self_shape[p_in.dim]:
                return False
        return True

    def checked(op_schema):
        self_s, indices_s, values_s = op_schema.args_schema[:3]
        shape = lambda s: tuple(s.strategies[0].output_spec.tensor_meta.shape)   # noqa: E731
        n_indexed = len(indices_s.children)   # 2.11's strategy takes no None index: dims 0 .. n-1
        kept = [spec for spec in strategy_fn(op_schema).strategies
                if valid(spec, shape(self_s), shape(values_s), n_indexed)]
        if not kept:
            mesh = values_s.mesh
            inputs = [self_s, *indices_s.children, values_s]
            whole = [d.Spec(mesh, (Replicate(),) * mesh.ndim, tensor_meta=s.strategies[0].output_spec.tensor_meta)
                     for s in inputs]
            kept = [OpSpec(output_specs=whole[0], input_specs=tuple(whole),
                           redistribute_cost=[generate_redistribute_costs(s, w) for s, w in zip(inputs, whole)])]
        return OpStrategy(kept)
    checked.colauto_fixed = True
    return checked


INDEX_PUT_FIXED = counters.counter(
    "DTensor strategy of index_put replaced: never sharded on a dim an index selects")


def _register_missing(op: torch._ops.OpOverload, rule) -> None:
    """`rule` registered for `op` unless DTensor has a one-mesh-dim rule of its own for it (torch 2.13's
    `op_single_dim_strategy_funcs`) or `rule` is registered already."""
    fn = _dtensor().prop.op_strategy_funcs.get(op)
    if op in _dtensor().prop.op_single_dim_strategy_funcs or getattr(fn, "args", (None,))[0] is rule:
        return
    _register_sharding(op, rule)


def _by_channel(grad_out, x, *rest, **kwargs) -> list:
    """The placements of native_batch_norm_backward(grad_out, input, weight, running_mean, running_var,
    save_mean, save_invstd, train, eps, output_mask) -> (grad_input, grad_weight, grad_bias): everything
    Replicate, or the [N, C, ...] tensors Shard(1) and the per-channel ones Shard(0)."""
    from torch.distributed.tensor import Replicate, Shard
    tensors = [t is not None and hasattr(t, "shape") for t in rest[:5]]   # weight .. save_invstd, optional
    tail = [None] * (len(rest) - 5 + len(kwargs))                          # train, eps, output_mask
    channel = ([Shard(1), Shard(0), Shard(0)],
               [Shard(1), Shard(1), *[Shard(0) if t else None for t in tensors], *tail])
    whole = ([Replicate()] * 3, [Replicate(), Replicate(), *[Replicate() if t else None for t in tensors], *tail])
    return [whole, channel]


def _register_sharding(op: torch._ops.OpOverload, rule) -> None:
    """DTensor's register_sharding, with every non-tensor argument in the key of DTensor's propagation
    cache. register_sharding keys it on the first int argument on: a SymInt[] such as constant_pad_nd's
    `pad` was left out, and a second pad of the same tensor got the first one's output shape."""
    from torch.distributed.tensor.experimental import register_sharding
    register_sharding(op)(rule)
    _dtensor().prop.op_to_schema_info[op] = _schema_info(op, needs_pytree=True)


def _schema_info(op: torch._ops.OpOverload, needs_pytree: bool):
    """A RuntimeSchemaInfo that keys DTensor's propagation cache on every argument from the first
    positional one that is not a plain Tensor (an optional tensor's None counts by position) and on every
    keyword-only one (torch 2.11 keys keyword arguments only by name, tensors included)."""
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
    arguments = op._schema.arguments
    tensor = torch.TensorType.get()
    first = next((i for i, a in enumerate(arguments) if not a.kwarg_only and a.type != tensor), 100)
    keys = [a.name for a in arguments if a.kwarg_only]
    return RuntimeSchemaInfo(first, keys or None, needs_pytree=needs_pytree)


def _padding(x, pad, *rest, **kwargs) -> list:
    """The placements of constant_pad_nd(x, pad, value): Replicate, or Shard(d) of input and output for
    each dim d that `pad` leaves as it is (pad lists the last dim's two amounts first)."""
    from torch.distributed.tensor import Replicate, Shard
    ndim = len(x.shape)
    padded = {ndim - 1 - i for i in range(len(pad) // 2) if pad[2 * i] != 0 or pad[2 * i + 1] != 0}
    tail = [None] * (1 + len(rest) + len(kwargs))     # pad, value: no tensors
    return [([Replicate()], [Replicate(), *tail])] + [([Shard(d)], [Shard(d), *tail])
                                                     for d in range(ndim) if d not in padded]


# CUDA's fused attention ops that take a mask (attn_bias) positionally. DTensor's rules shard the mask as
# the query (Shard(1) over heads), which a mask that broadcasts over heads ([B, 1, q, k], HF's) cannot be
# (uneven: the heads strategy is dropped, and q/k/v are gathered over tp), and its cuDNN forward rule
# has no mask entry at all (torch 2.11-2.13: "zip() argument 2 is shorter than argument 1", HF Llama
# 8B under dp x tp on H200s).
_MASKED_ATTENTION = ("_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
                     "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward")


def shard_attention_masks() -> None:
    """From now on, DTensor places the mask of CUDA's fused attention ops by its own shape: along each
    mesh dim the mask takes the query's Shard(d) where it has that dim whole, and Replicate where it
    broadcasts over it (size 1) or the query is replicated. The q/k/v and output placements stay DTensor's
    own (its rule, asked without the mask). A mask that needs a gradient (efficient attention's
    grad_input_mask) keeps DTensor's rule."""
    d = _dtensor()
    for name in _MASKED_ATTENTION:
        op = getattr(torch.ops.aten, name).default
        fn = d.prop.op_strategy_funcs.get(op)
        if fn is None or getattr(fn, "_colauto_mask", False):
            continue
        # the rule reads grad_input_mask (efficient backward, which DTensor keys on tensors alone): every
        # non-tensor argument keys the propagation cache
        info = d.prop.op_to_schema_info.get(op) or _schema_info(op, needs_pytree=False)
        d.prop.register_op_strategy(op, _mask_by_shape(op, fn), info)


def _mask_by_shape(op: torch._ops.OpOverload, rule):
    import dataclasses

    from torch.distributed.tensor._op_schema import OpSpec, OpStrategy
    from torch.distributed.tensor._ops.utils import generate_redistribute_costs
    from torch.distributed.tensor.placement_types import Shard
    d = _dtensor()
    names = [a.name for a in op._schema.arguments]
    at, query = names.index("attn_bias"), names.index("query")
    grad_mask = names.index("grad_input_mask") if "grad_input_mask" in names else None

    def strategy(op_schema):
        args = tuple(op_schema.args_schema)
        bias = args[at] if len(args) > at else None
        if (not isinstance(bias, OpStrategy)
                or (grad_mask is not None and len(args) > grad_mask and len(args[grad_mask]) > 3 and args[grad_mask][3])):
            return rule(op_schema)
        without = rule(dataclasses.replace(op_schema, args_schema=args[:at] + (None,) + args[at + 1:]))
        slot = sum(isinstance(a, OpStrategy) for a in args[:at])        # the mask's place among the tensor inputs
        q_slot = sum(isinstance(a, OpStrategy) for a in args[:query])
        given = bias.strategies[0].output_spec
        shape = given.tensor_meta.shape
        offset = 4 - len(shape)                                          # the mask's dims align from the right

        def place(p):     # plain Shard only: a strided or partial query placement leaves the mask whole
            if type(p) is not Shard or p.dim - offset < 0 or shape[p.dim - offset] == 1:
                return d.Replicate()
            return Shard(p.dim - offset)
        out = []
        for s in without.strategies:
            specs = list(s.input_specs)
            want = d.Spec(given.mesh, tuple(place(p) for p in specs[q_slot].placements), tensor_meta=given.tensor_meta)
            specs.insert(slot, want)
            costs = list(s.redistribute_cost or [])
            costs.insert(slot, generate_redistribute_costs(bias, want))
            out.append(OpSpec(s.output_specs, tuple(specs), costs))
        return OpStrategy(out)
    strategy._colauto_mask = True
    return strategy


# DTensor modules that call redistribute_local_tensor by a name of their own
_REDISTRIBUTE_USERS = ("torch.distributed.tensor._redistribute", "torch.distributed.tensor._dispatch",
                       "torch.distributed.tensor._api")


def strided_sizes_outside_fake_mode() -> None:
    """From now on, the index arithmetic of DTensor's strided shards runs on real tensors. Gathering a
    `_StridedShard` (a sharded dim merged by a view after a replicated one: the ranks' stack with attention
    heads in a lifted tp graph, parallel/tp_graph.py) asks `local_shard_size_and_offset` for the rank's
    indices, which it computes with `torch.arange(...).tolist()`: inside AOTAutograd's fake mode that is a
    data-dependent read, and the gather failed ("DataDependentOutputException: aten._local_scalar_dense"; HF
    T5 and ResNet under tp=2, torch 2.13). The sizes are plain ints there, so the same arithmetic runs outside
    every dispatch mode (fake, proxy, functional: private torch.utils._python_dispatch._disable_current_modes;
    torch.distributed.tensor.placement_types._StridedShard, private too; absent: nothing to do)."""
    from torch.distributed.tensor import placement_types
    from torch.utils._python_dispatch import _disable_current_modes
    cls = getattr(placement_types, "_StridedShard", None)
    fn = getattr(cls, "local_shard_size_and_offset", None)
    if fn is None or getattr(fn, "_colauto_outside_fake", False):
        return

    @functools.wraps(fn)
    def wrapper(self, curr_local_size, *args, **kwargs):
        if isinstance(curr_local_size, int):
            with _disable_current_modes():
                return fn(self, curr_local_size, *args, **kwargs)
        return fn(self, curr_local_size, *args, **kwargs)
    wrapper._colauto_outside_fake = True
    cls.local_shard_size_and_offset = wrapper


# views whose DTensor rule failed on a sharded dim and ran on the gathered input (view op)
STRIDED_VIEWS_GATHERED = counters.counter("views of sharded dims DTensor has no rule for, run gathered (op)")


def views_of_strided_shards() -> None:
    """From now on, a view DTensor's rule fails on (its view-family rules, `reshape_strategy`) runs on its
    input gathered along the mesh dims that block it, and is counted: a `_StridedShard` always, and a plain
    `Shard` for `_unsafe_view` (whose output, by its contract, aliases nothing anyone mutates through: matmul's
    reshapes). Both are a sharded dim merged into the dim before it:
    - torch 2.13's rule raises KeyError on a strided shard (`_rewrite_strided_shard`): in a lifted tp graph the
      ranks' stack merged with T5's [batch x heads] attention scores, in the backward of their matmul, where no
      colauto code sees the op ("Sharding propagation failed for aten.view.default(Spec(f32[2, 8, 16, 16](_S(1,
      2))), [16, 16, 16])");
    - torch 2.11's rule refuses to flatten a sharded dim that is not the first ("Attempted to flatten multiple
      dimensions, with dimension 1 being sharded"): T5's and BLOOM's attention under DTensor modules.
    A `view` of a plain shard keeps DTensor's refusal: its output may be mutated in place, which must reach the
    input. Other failures are left as they are."""
    from torch.distributed.tensor.placement_types import Shard, _StridedShard
    d = _dtensor()
    for op, fn in list(d.prop.op_strategy_funcs.items()):
        if getattr(fn, "__name__", "") != "reshape_strategy" or getattr(fn, "_colauto_strided", False):
            continue
        gathers = (_StridedShard, Shard) if op is torch.ops.aten._unsafe_view.default else (_StridedShard,)
        d.prop.op_strategy_funcs[op] = _gathering(op, fn, gathers)


def _gathering(op: torch._ops.OpOverload, rule, gathers: tuple):
    """`rule` (a view's strategy), retried on its input with the `gathers` placements made Replicate where it
    raises on them (`views_of_strided_shards`)."""
    from torch.distributed.tensor._op_schema import OpSpec, OpStrategy
    from torch.distributed.tensor._ops.utils import generate_redistribute_costs
    d = _dtensor()

    def strategy(op_schema):
        try:
            return rule(op_schema)
        except Exception:   # noqa: BLE001 - retried below where a sharded dim is to blame, else raised
            given = op_schema.args_schema[0] if op_schema.args_schema else None
            if not isinstance(given, OpStrategy) or len(given.strategies) != 1:
                raise
            spec = given.strategies[0].output_spec
            placements = tuple(d.Replicate() if isinstance(p, gathers) else p for p in spec.placements)
            if placements == tuple(spec.placements):
                raise
            whole = OpStrategy([OpSpec(d.Spec(spec.mesh, placements, tensor_meta=spec.tensor_meta))])
            out = rule(dataclasses.replace(op_schema, args_schema=(whole, *op_schema.args_schema[1:])))
            for s in out.strategies:       # costs from the input as it is, which DTensor redistributes
                s.redistribute_cost = [generate_redistribute_costs(given, s.input_specs[0])]
            STRIDED_VIEWS_GATHERED[str(op)] += 1
            return out
    strategy._colauto_strided = True
    strategy.__name__ = "reshape_strategy"
    return strategy


def keep_local_layout() -> None:
    """From now on, a redistributed DTensor's local tensor is laid out as its global metadata says
    (a copy where the collective made it otherwise). DTensor keeps a redistributed tensor's global
    strides (those of the tensor before), but its collectives return their results contiguous: an
    attention query laid out [batch, seq, heads, dim] behind its [batch, heads, seq, dim] shape comes
    back from an all-gather contiguous in the latter. Ops that lay their output out like their input (CPU
    flash attention, elementwise ops) then give a local tensor whose layout differs from the global
    strides DTensor computes for their output from the tensor before redistribution, and a later
    `reshape`, which DTensor decides from the global strides, becomes a `view` the local tensor cannot
    take ("Cannot view a tensor with shape ..."): HF attention's `transpose(1, 2).reshape(...)` after a
    query gathered over one mesh axis (Llama under dp x tp, its mask replicated) or moved from heads to
    batch (T5's replicated position bias under tp)."""
    import importlib
    for name in _REDISTRIBUTE_USERS:
        module = importlib.import_module(name)
        fn = module.redistribute_local_tensor
        if getattr(fn, "_colauto_keeps_layout", False):
            continue
        module.redistribute_local_tensor = _keeping_layout(fn)


def _keeping_layout(redistribute):
    @functools.wraps(redistribute)
    def wrapper(local_tensor, current_spec, target_spec, *args, **kwargs):
        out = redistribute(local_tensor, current_spec, target_spec, *args, **kwargs)
        meta = target_spec.tensor_meta or current_spec.tensor_meta
        if out is local_tensor or meta is None or not isinstance(out, torch.Tensor):
            return out
        return laid_out_as(out, meta.stride)
    wrapper._colauto_keeps_layout = True
    return wrapper


def laid_out_as(t: torch.Tensor, stride) -> torch.Tensor:
    """`t`, copied where needed so that its dims are laid out in the order `stride` (a tensor of the same
    rank, e.g. `t`'s global strides) lays them out: `t` itself where they already are (dims of size one
    and a `stride` with zeros, an expanded tensor's, are not compared)."""
    if t.dim() < 2 or len(stride) != t.dim() or any(s == 0 for s in stride):
        return t
    order = sorted(range(t.dim()), key=lambda d: -stride[d])          # outermost first; ties keep dim order
    expected, step = [0] * t.dim(), 1
    for d in reversed(order):
        expected[d] = step
        step *= t.shape[d]
    if all(t.shape[d] == 1 or t.stride(d) == expected[d] for d in range(t.dim())):
        return t
    inverse = sorted(range(t.dim()), key=order.__getitem__)
    return t.permute(order).contiguous().permute(inverse)
