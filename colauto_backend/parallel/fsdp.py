"""FSDP on the captured graph (experimental, COLAUTO_FSDP=graph): the user's Parameters hold their shards.

A sharded plan without tensor parallelism runs here instead of `emit.Sharded` (DTensor parameters on the
module and a re-trace of the user's code) when COLAUTO_FSDP=graph. Inside the backend call, for the one
captured graph:

1. every parameter and buffer the graph reads starts as rank 0's (`data.prepare`, as DDP broadcasts);
2. each parameter the plan shards (dim 0 over the mesh's one fsdp axis) is guarded by identity, not by
   shape (`compat.guard_parameter_by_identity`), and its `.data` becomes the rank's rows, in place: the
   same Parameter object, so an optimizer built before compiling steps on the shard, and `p.grad` is the
   shard's gradient;
3. the graph reads each such parameter through `gather`: an all-gather of the rows in forward, whose
   backward reduce-scatters the gradient and divides it by the world (the ranks' mean, as DDP), so the
   joint graph AOTAutograd traces, and the planner costs, holds both collectives; every other
   parameter's gradient is all-reduced as under data parallelism (`data.reduce_gradients`);
4. while Dynamo traces any frame later (a recompile for new sizes or under no_grad, a graph after a
   graph break), each sharded Parameter holds a full-shape tensor with no storage, so the user's code
   sees the shapes it was written for (`_standins_on`, `_standins_off`).

Limits (why it is not the default yet): one fsdp axis only; only dim-0 shards; code outside the compiled
graphs sees the shards (an eager region after a graph break, `clip_grad_norm_`, which would clip by each
rank's own norm); `state_dict()` gives DTensors (`_expose_as_dtensors`), but `load_state_dict` of whole
tensors does not cut them; torch._dynamo.reset() forgets the
stand-ins, so a sharded module compiled again after it fails in Dynamo's trace. Research and evidence:
bench/sessions/fsdp_research/.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.fx as fx
from torch.utils.weak import WeakIdKeyDictionary

from .. import _torch_compat as compat
from .. import counters, report
from ..config import ConfigError
from . import data
from .plan import ParallelPlan

SHARDED = counters.counter("parameters sharded on the captured graph (COLAUTO_FSDP=graph)")
_FULL: WeakIdKeyDictionary = WeakIdKeyDictionary()    # sharded Parameter -> (full shape, full stride)
_STASH: WeakIdKeyDictionary = WeakIdKeyDictionary()   # while Dynamo traces: sharded Parameter -> its shard


def rows(n: int, rank: int, world: int) -> tuple[int, int]:
    """(start, length) of the rank's rows of `n`: torch.chunk's sizes, ceil(n / world) a rank, the last
    ranks' fewer or none (as DTensor's Shard(0))."""
    chunk = -(-n // world)
    start = min(rank * chunk, n)
    return start, min(start + chunk, n) - start


def _padded(t: torch.Tensor, n_rows: int) -> torch.Tensor:
    """`t` with zero rows appended up to `n_rows` (equal pieces for the collectives), contiguous."""
    return torch.nn.functional.pad(t, [0, 0] * (t.dim() - 1) + [0, n_rows - t.shape[0]]).contiguous()


class _Gather(torch.autograd.Function):
    """Rows -> the whole parameter (all-gather, padded to equal pieces); backward: the gradient's
    reduce-scatter over the group, divided by its size, back to the rank's rows."""

    @staticmethod
    def forward(ctx, shard, shape, group_name, world, rank):
        ctx.meta = (tuple(shape), group_name, world, rank)
        chunk = -(-shape[0] // world)
        full = funcol.wait_tensor(funcol.all_gather_tensor(_padded(shard, chunk), 0, group_name))
        return full.narrow(0, 0, shape[0])

    @staticmethod
    def backward(ctx, grad):
        shape, group_name, world, rank = ctx.meta
        chunk = -(-shape[0] // world)
        mine = funcol.wait_tensor(funcol.reduce_scatter_tensor(_padded(grad, chunk * world), "sum", 0, group_name))
        return mine.narrow(0, 0, rows(shape[0], rank, world)[1]) / world, None, None, None, None


def gather(shard: torch.Tensor, shape: tuple[int, ...], group_name: str, world: int, rank: int) -> torch.Tensor:
    return _Gather.apply(shard, shape, group_name, world, rank)


def _standins_on(*args) -> None:
    """Dynamo starts tracing: each sharded Parameter holds a storage-less tensor of its full shape."""
    trigger = getattr(args[0], "callback_trigger", None) if args else None
    if trigger is not None and getattr(trigger, "name", "DYNAMO") != "DYNAMO":
        return                     # a lazy backward compile, not a trace of user code
    with torch.no_grad():
        for p, (shape, stride) in list(_FULL.items()):
            if p in _STASH:
                continue
            _STASH[p] = shard = p.data
            stand = torch.empty_strided(shape, stride, dtype=shard.dtype, device=shard.device)
            stand.untyped_storage().resize_(0)
            p.data = stand


def _standins_off(*args) -> None:
    with torch.no_grad():
        for p in list(_STASH.keys()):
            p.data = _STASH.pop(p)


def shards(plan: ParallelPlan, names: dict[int, str], example_inputs: list) -> list[int]:
    """The graph-input positions of the parameters `plan` shards, checked to be what this path runs."""
    roles = [role for role, _ in plan.axes]
    if roles != ["fsdp"]:
        raise ConfigError(f"COLAUTO_FSDP=graph runs one fsdp axis only, not mesh {plan.mesh_str}: set "
                          "COLAUTO_MESH=fsdp=N, or unset COLAUTO_FSDP")
    at = []
    for i, name in names.items():
        spec = plan.storage.get(name)
        if spec is None or not isinstance(example_inputs[i], torch.nn.Parameter) or spec == ("R",):
            continue
        if spec != ("S0",):
            raise ConfigError(f"COLAUTO_FSDP=graph shards parameters on dim 0 only; the plan shards {name} as "
                              f"{spec}: unset COLAUTO_FSDP")
        at.append(i)
    return at


def compile(gm: fx.GraphModule, example_inputs: list, plan: ParallelPlan, make_local: Callable) -> Callable:
    """The captured graph with the plan's sharded parameters gathered in it, compiled by `make_local(dp)`;
    the parameters are sharded in place here (see the module docstring)."""
    from .entry import state_names, owner_module, _checked_gradients   # local import: entry imports this module
    names = state_names(gm)
    at = shards(plan, names, example_inputs)
    dp = data.DataParallel.world_group()
    data.prepare(gm, example_inputs, dp)          # rank 0's values everywhere, before any is cut
    world, rank = dist.get_world_size(), dist.get_rank()
    group = compat.process_group_name(dist.group.WORLD)
    compat.on_dynamo_compile(_standins_on, _standins_off)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = list(example_inputs)
    cut = 0
    for i in at:
        p = example_inputs[i]
        compat.guard_parameter_by_identity(placeholders[i])
        if p not in _FULL:
            full = _STASH.get(p, p.data)
            shape = tuple(full.shape)
            _FULL[p] = (shape, full.stride())
            start, length = rows(shape[0], rank, world)
            with torch.no_grad():
                mine = full.narrow(0, start, length).clone()
            if p in _STASH:
                _STASH[p] = mine                  # put in place when this trace ends
            else:
                p.data = mine
            SHARDED[names[i]] += 1
            cut += 1
        shape = _FULL[p][0]
        inputs[i] = compat.fake_parameter_like(_STASH.get(p, p.data), p.requires_grad)   # the shard, as it runs
        node = placeholders[i]
        with gm.graph.inserting_after(node):
            gathered = gm.graph.call_function(gather, (node, shape, group, world, rank))
        node.replace_all_uses_with(gathered, delete_user_cb=lambda u: u is not gathered)
        for key in ("example_value", "val", "tensor_meta"):
            node.meta.pop(key, None)
    gm.graph.lint()
    gm.recompile()
    if cut and report._rank() == 0:
        print(f"colauto: COLAUTO_FSDP=graph: {cut} parameters cut to their dim-0 rows in place over "
              f"{plan.mesh_str}, gathered in the captured graph ({len(at)} read by this graph)", flush=True)
    if at:
        _expose_as_dtensors(owner_module(gm, example_inputs), plan)
    local = data.DataParallel(dp.world, dp.group_name, not_reduced=frozenset(at))
    compiled = make_local(local)(gm, inputs)
    return _checked_gradients(gm, example_inputs, compiled)


_EXPOSED: WeakIdKeyDictionary = WeakIdKeyDictionary()   # module -> True once its state_dict hook is on


def _expose_as_dtensors(root: torch.nn.Module, plan: ParallelPlan) -> None:
    """`state_dict()` of `root` or of any module holding its sharded parameters (the model inside a wrapper
    that was compiled) gives each sharded parameter as a DTensor (Shard(0) over the plan's mesh) whose local
    tensor is the Parameter's own shard: torch.distributed.checkpoint saves the whole parameter and loads
    into the shard in place. The hook sits on each module that holds such a parameter itself, so it runs
    whichever ancestor's state_dict() is asked. The mesh is made here, where every rank compiles."""
    from torch.distributed.tensor import DTensor, Shard
    from .mesh import device_mesh
    holders = [m for m in root.modules() if m not in _EXPOSED
               and any(p in _FULL for p in m._parameters.values() if p is not None)]
    if not holders:
        return
    built = device_mesh(plan.axes)

    def hook(mod, state_dict, prefix, local_metadata) -> None:
        for name, p in mod._parameters.items():
            key, full = prefix + name, (None if p is None else _FULL.get(p))
            if full is not None and key in state_dict and not isinstance(state_dict[key], DTensor):
                state_dict[key] = DTensor.from_local(state_dict[key], built, [Shard(0)], run_check=False,
                                                     shape=torch.Size(full[0]), stride=full[1])
    for m in holders:
        m.register_state_dict_post_hook(hook)
        _EXPOSED[m] = True


def full_tensor(p: torch.Tensor) -> torch.Tensor:
    """The whole of a parameter this path sharded (an all-gather: every rank must call it, in the same
    order), or `p` itself if it is not sharded."""
    got = _FULL.get(p)
    if got is None:
        return p.detach()
    shape = got[0]
    world = dist.get_world_size()
    chunk = -(-shape[0] // world)
    mine = p.detach()
    padded = _padded(mine, chunk)
    pieces = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(pieces, padded)
    return torch.cat(pieces).narrow(0, 0, shape[0])
