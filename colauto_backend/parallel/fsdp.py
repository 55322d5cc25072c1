"""FSDP on the captured graph (the default, COLAUTO_FSDP=graph): the user's Parameters hold their shards.

A sharded plan without tensor parallelism runs here: one fsdp axis, alone or with axes that replicate
(dp: HSDP; a tp axis no layer uses acts as dp too). `entry.compile` sends it here instead of
`emit.Sharded` (DTensor parameters on the module and a re-trace of the user's code, the way tp plans and
COLAUTO_FSDP=dtensor run); a plan this path cannot run (`unsupported`: a shard on another dim or axis)
goes there, counted. Inside the backend call, for the one captured graph:

1. every parameter and buffer the graph reads starts as rank 0's (`data.prepare`, as DDP broadcasts);
2. each parameter the plan shards (dim 0 over the mesh's fsdp axis) is guarded by identity, not by
   shape (`compat.guard_parameters_by_identity`), and its `.data` becomes the rank's rows (of its fsdp
   group), in place: the same Parameter object, so an optimizer built before compiling steps on the
   shard, and `p.grad` is the shard's gradient;
3. the graph reads each such parameter through `gather`: an all-gather of the rows over the fsdp group
   in forward, whose backward reduce-scatters the gradient over that group, all-reduces the shard over
   the other axes' group where there is one, and divides by the world (the ranks' mean, as DDP), so the
   joint graph AOTAutograd traces, and the planner costs, holds the collectives; every other parameter's
   gradient is all-reduced over the world as under data parallelism (`data.reduce_gradients`). A graph
   that reads a parameter an earlier graph cut (a weight on both sides of a graph break) gathers it too;
4. while Dynamo traces any frame later (a recompile for new sizes or under no_grad, a graph after a
   graph break, a compile after torch._dynamo.reset()), each sharded Parameter holds a full-shape tensor
   with no storage, so the user's code sees the shapes it was written for (`_standins_on`,
   `_standins_off`, registered again after a reset by `compat.on_dynamo_compile`).

`state_dict()` gives the shards as DTensors (`_expose_as_dtensors`), and `load_state_dict` takes whole
tensors or DTensors and keeps the rank's rows (`_load_rows`). `clip_grad_norm_` clips by the whole
gradient's norm; once a parameter is cut, torch.nn.utils.clip_grad_norm_ comes here too
(`compat.route_clip_grad_norm`), since torch's own would clip by each rank's shards' norm.

Limits: code outside the compiled graphs sees the shards (an eager region after a graph break fails in
one line where it makes a gradient of a cut parameter, `data.check_eager_gradients`; a `clip_grad_norm_` imported by name
before the first compile is torch's, per rank; `torch.nn.utils.get_total_norm` of the gradients is per
rank); each graph plans on its own (a graph under no_grad first, then the training graph: the
first plan's cuts stand). Research and evidence: bench/sessions/fsdp_research/.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import torch
import torch.distributed as dist
import torch.fx as fx
from torch.utils.weak import WeakIdKeyDictionary

from .. import _torch_compat as compat
from .. import counters, report
from . import data
from .plan import ParallelPlan

SHARDED = counters.counter("parameters sharded on the captured graph (COLAUTO_FSDP=graph)")
LEFT_WHOLE = counters.counter("parameters left whole (not cut): read whole earlier in the step, outside the graph")
_FULL: WeakIdKeyDictionary = WeakIdKeyDictionary()    # sharded Parameter -> its _Cut
_STASH: WeakIdKeyDictionary = WeakIdKeyDictionary()   # while Dynamo traces: sharded Parameter -> its shard
_MESHES: dict = {}                                    # mesh axes -> the DeviceMesh built for them (once)


@dataclasses.dataclass(frozen=True)
class _Groups:
    """Where a sharded parameter's collectives run: its rows are cut over the fsdp group (this rank is
    `fsdp_rank` of `fsdp_world`), its shard's gradient is averaged over the group of the other axes (None:
    no other axis)."""
    fsdp_group: str
    fsdp_world: int
    fsdp_rank: int
    dp_group: str | None
    world: int
    mesh: object                       # the DeviceMesh, for state_dict()'s DTensors
    placements: tuple                  # DTensor placements of a shard on `mesh`


@dataclasses.dataclass(frozen=True)
class _Cut:
    shape: tuple[int, ...]             # the whole parameter's
    stride: tuple[int, ...]
    groups: _Groups | None             # None: cut by tp_graph.py, by DTensor placements (`mesh`, `placements`)
    tp_mesh: object = None
    tp_placements: tuple = ()

    @property
    def rows(self) -> tuple[int, int]:
        return rows(self.shape[0], self.groups.fsdp_rank, self.groups.fsdp_world)

    @property
    def mesh(self):
        return self.tp_mesh if self.groups is None else self.groups.mesh

    @property
    def placements(self) -> tuple:
        return self.tp_placements if self.groups is None else self.groups.placements

    def piece(self, whole: torch.Tensor) -> torch.Tensor:
        """This rank's piece of the whole parameter `whole`."""
        if self.groups is None:
            return compat.local_piece(whole, self.mesh, self.placements)
        start, length = self.rows
        return whole.narrow(0, start, length)

    def whole(self, piece: torch.Tensor) -> torch.Tensor:
        """The whole parameter from every rank's piece (a collective: every rank calls it, in order)."""
        if self.groups is None:
            from torch.distributed.tensor import DTensor
            return DTensor.from_local(piece, self.mesh, self.placements, run_check=False,
                                      shape=torch.Size(self.shape), stride=self.stride).full_tensor()
        return _all_gather_rows(piece, self.shape[0], self.groups.fsdp_world, self.groups.fsdp_group)


def rows(n: int, rank: int, world: int) -> tuple[int, int]:
    """(start, length) of the rank's rows of `n`: torch.chunk's sizes, ceil(n / world) a rank, the last
    ranks' fewer or none (as DTensor's Shard(0))."""
    chunk = -(-n // world)
    start = min(rank * chunk, n)
    return start, min(start + chunk, n) - start


def _padded(t: torch.Tensor, n_rows: int) -> torch.Tensor:
    """`t` with zero rows appended up to `n_rows` (equal pieces for the collectives), contiguous; `t` itself
    where it has them (a copy of each whole gradient would sit beside it at the backward's peak)."""
    if t.shape[0] == n_rows:
        return t.contiguous()
    return torch.nn.functional.pad(t, [0, 0] * (t.dim() - 1) + [0, n_rows - t.shape[0]]).contiguous()


def _all_gather_rows(shard: torch.Tensor, n: int, world: int, group: str) -> torch.Tensor:
    """The `n` rows the group's ranks hold between them (each piece padded to ceil(n / world) rows)."""
    full = compat.collective("all_gather_into_tensor", _padded(shard, -(-n // world)), world, group)
    return full.narrow(0, 0, n)


class _Gather(torch.autograd.Function):
    """Rows -> the whole parameter (all-gather over the fsdp group, padded to equal pieces); backward: the
    gradient's reduce-scatter over that group back to the rank's rows, all-reduced over the dp group where
    there is one, divided by the world (the mean over every rank's micro-batch)."""

    @staticmethod
    def forward(ctx, shard, shape, fsdp_group, fsdp_world, fsdp_rank, dp_group, world):
        ctx.meta = (tuple(shape), fsdp_group, fsdp_world, fsdp_rank, dp_group, world)
        return _all_gather_rows(shard, shape[0], fsdp_world, fsdp_group)

    @staticmethod
    def backward(ctx, grad):
        shape, fsdp_group, fsdp_world, fsdp_rank, dp_group, world = ctx.meta
        chunk = -(-shape[0] // fsdp_world)
        mine = compat.collective("reduce_scatter_tensor", _padded(grad, chunk * fsdp_world), "sum", fsdp_world, fsdp_group)
        if dp_group is not None:
            mine = compat.collective("all_reduce", mine, "sum", dp_group)
        return mine.narrow(0, 0, rows(shape[0], fsdp_rank, fsdp_world)[1]) / world, None, None, None, None, None, None


def gather(shard: torch.Tensor, shape: tuple[int, ...], g: _Groups) -> torch.Tensor:
    return _Gather.apply(shard, shape, g.fsdp_group, g.fsdp_world, g.fsdp_rank, g.dp_group, g.world)


def _read_whole(p: torch.Tensor, g: _Groups | None) -> bool:
    """`p`, not yet cut, was read whole earlier in this step by code an autograd graph still holds (a tied
    input embedding run eagerly before the head's graph cuts it: HF OPT under transformers 5.17). Cut now,
    its gradient from this graph would be the rows' while autograd checks it against the whole shape (torch's
    "invalid gradient" error), and that code's own gradient is whole: so it is left whole."""
    if p in _FULL or g is None or not p.requires_grad:
        return False
    full = p.data            # not cut, so never stood in for (_standins_on)
    start, length = rows(full.shape[0], g.fsdp_rank, g.fsdp_world)
    with torch.no_grad():
        p.data = full.narrow(0, start, length)
        try:
            return compat.accumulator_shape(p) != tuple(p.data.shape)
        finally:
            p.data = full


def _standins_on(*args) -> None:
    """Dynamo starts tracing: each sharded Parameter holds a storage-less tensor of its full shape."""
    trigger = getattr(args[0], "callback_trigger", None) if args else None
    if trigger is not None and getattr(trigger, "name", "DYNAMO") != "DYNAMO":
        return                     # a lazy backward compile, not a trace of user code
    with torch.no_grad():
        for p, cut in list(_FULL.items()):
            if p in _STASH:
                continue
            _STASH[p] = shard = p.data
            stand = torch.empty_strided(cut.shape, cut.stride, dtype=shard.dtype, device=shard.device)
            stand.untyped_storage().resize_(0)
            p.data = stand


def _standins_off(*args) -> None:
    with torch.no_grad():
        for p in list(_STASH.keys()):
            p.data = _STASH.pop(p)


def is_cut(p: torch.Tensor) -> bool:
    """`p` is a Parameter this path cut to its rows in place."""
    return p in _FULL


def reads_cut(example_inputs: list) -> bool:
    """Some graph input is a Parameter an earlier graph cut (a weight read on both sides of a graph break)."""
    return any(isinstance(t, torch.nn.Parameter) and is_cut(t) for t in example_inputs)


def unsupported(plan: ParallelPlan, names: dict[int, str], example_inputs: list) -> str | None:
    """Why this path cannot run `plan` on this graph (None: it can). It runs plans without tensor
    parallelism whose parameters are each replicated, or cut on dim 0 over the mesh's one fsdp axis and
    replicated over the others (which then act as data parallelism: every axis splits the batch)."""
    roles = [role for role, _ in plan.axes]
    sharded = tuple("S0" if role == "fsdp" else "R" for role in roles)
    for i, name in names.items():
        spec = plan.storage.get(name)
        if not isinstance(example_inputs[i], torch.nn.Parameter) or spec is None or all(x == "R" for x in spec):
            continue
        if roles.count("fsdp") != 1:
            return f"mesh {plan.mesh_str} shards parameters without one fsdp axis"
        if tuple(spec) != sharded:
            return f"the plan places a parameter as {'/'.join(spec)} on {plan.mesh_str}, not on dim 0 over fsdp alone"
    return None


def shards(plan: ParallelPlan, names: dict[int, str], example_inputs: list) -> tuple[list[int], bool]:
    """The graph-input positions of the parameters gathered in this graph: those `plan` shards (a plan
    `unsupported` accepts), and those an earlier graph cut (gathered as they were cut, whatever this
    graph's plan says: they hold their rows now); and whether `plan` shards any parameter itself."""
    at, planned = [], False
    for i, name in names.items():
        t = example_inputs[i]
        if not isinstance(t, torch.nn.Parameter):
            continue
        spec = plan.storage.get(name)
        if t in _FULL or (spec is not None and any(x != "R" for x in spec)):
            at.append(i)
            planned = planned or t not in _FULL
    return at, planned


def built_mesh(axes):
    """The DeviceMesh of `axes`, built once per set of axes (every rank compiles, so every rank builds it)."""
    from .mesh import device_mesh
    if axes not in _MESHES:
        _MESHES[axes] = device_mesh(axes)
    return _MESHES[axes]


def cut_in_place(p: torch.nn.Parameter, piece: torch.Tensor, mesh, placements: tuple) -> None:
    """Parameter `p` (whole) now holds only `piece`, its DTensor local tensor under `placements` on `mesh`
    (parallel/tp_graph.py's cuts; fsdp's own are made in `compile`)."""
    full = _STASH.get(p, p.data)
    _FULL[p] = _Cut(tuple(full.shape), full.stride(), None, mesh, placements)
    with torch.no_grad():
        piece = piece.clone()
    if p in _STASH:
        _STASH[p] = piece
    else:
        p.data = piece
    compat.route_clip_grad_norm(clip_grad_norm_)


def groups(plan: ParallelPlan) -> _Groups:
    """The plan's mesh (built once per set of axes: every rank compiles, so every rank builds it) and this
    rank's place in it."""
    from torch.distributed.tensor import Replicate, Shard
    built = built_mesh(plan.axes)
    roles = [role for role, _ in plan.axes]
    others = [role for role in roles if role != "fsdp"]   # replicated over: a gradient is averaged there
    over = None if not others else built[others[0]] if len(others) == 1 else built["_".join(others)]   # flattened
    dp = None if over is None else compat.process_group_name(over.get_group())
    return _Groups(compat.process_group_name(built.get_group("fsdp")), built.size(roles.index("fsdp")),
                   built.get_local_rank("fsdp"), dp, dist.get_world_size(), built,
                   tuple(Shard(0) if role == "fsdp" else Replicate() for role in roles))


def compile(gm: fx.GraphModule, example_inputs: list, plan: ParallelPlan, make_local: Callable) -> Callable:
    """The captured graph with the plan's sharded parameters gathered in it, compiled by `make_local(dp)`;
    the parameters are sharded in place here (see the module docstring)."""
    from .entry import state_names, owner_module, _checked_gradients, _live_modules  # entry imports this module
    names = state_names(gm)
    at, planned = shards(plan, names, example_inputs)
    dp = data.DataParallel.world_group()
    data.prepare(gm, example_inputs, dp)          # rank 0's values everywhere, before any is cut
    g = groups(plan) if planned else None
    compat.on_dynamo_compile(_standins_on, _standins_off)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    whole = [i for i in at if _read_whole(example_inputs[i], g)]
    for i in whole:            # replicated instead: its gradient averaged as under dp (data.py)
        LEFT_WHOLE[names[i]] += 1
    at = [i for i in at if i not in whole]
    inputs = list(example_inputs)
    cut = 0
    compat.guard_parameters_by_identity([placeholders[i] for i in at])
    for i in at:
        p = example_inputs[i]
        if p not in _FULL:
            full = _STASH.get(p, p.data)
            _FULL[p] = _Cut(tuple(full.shape), full.stride(), g)
            start, length = _FULL[p].rows
            with torch.no_grad():
                mine = full.narrow(0, start, length).clone()
            if p in _STASH:
                _STASH[p] = mine                  # put in place when this trace ends
            else:
                p.data = mine
            SHARDED[names[i]] += 1
            cut += 1
            compat.route_clip_grad_norm(clip_grad_norm_)
        cut_p = _FULL[p]
        if cut_p.groups is None:
            from ..config import ConfigError
            raise ConfigError(f"colauto: a graph after a graph break reads {names[i]}, which tensor parallelism "
                              "cut in an earlier graph: remove the graph break (TORCH_LOGS=graph_breaks names it), "
                              "or set COLAUTO_MESH without tp")
        inputs[i] = compat.fake_parameter_like(_STASH.get(p, p.data), p.requires_grad)   # the shard, as it runs
        node = placeholders[i]
        with gm.graph.inserting_after(node):
            gathered = gm.graph.call_function(gather, (node, cut_p.shape, cut_p.groups))
        node.replace_all_uses_with(gathered, delete_user_cb=lambda u: u is not gathered)
        for key in ("example_value", "val", "tensor_meta"):
            node.meta.pop(key, None)
    gm.graph.lint()
    gm.recompile()
    if cut and report._rank() == 0:
        print(f"colauto: COLAUTO_FSDP=graph: {cut} parameters cut to their dim-0 rows in place over "
              f"{plan.mesh_str}, gathered in the captured graph ({len(at)} read by this graph)", flush=True)
    live = _live_modules() if at else None     # one scan of the objects for both lookups
    if at:
        _expose_as_dtensors(owner_module(gm, example_inputs, live))
    local = data.DataParallel(dp.world, dp.group_name, not_reduced=frozenset(at))
    compiled = make_local(local)(gm, inputs)
    # The frame's trace is over: the shards go back now, before Dynamo builds and checks its guards (torch
    # 2.11's identity guard prints the Parameter's values, which a stand-in has none of: a segfault).
    _standins_off()
    return _checked_gradients(gm, example_inputs, compiled, live)


_EXPOSED: WeakIdKeyDictionary = WeakIdKeyDictionary()   # module -> True once its state dict hooks are on


def _expose_as_dtensors(root: torch.nn.Module) -> None:
    """`state_dict()` of `root` or of any module holding its sharded parameters (the model inside a wrapper
    that was compiled) gives each sharded parameter as a DTensor (Shard(0) over the fsdp axis, replicated
    over dp) whose local tensor is the Parameter's own shard: torch.distributed.checkpoint saves the whole
    parameter and loads into the shard in place. `load_state_dict` takes the whole parameter (a tensor or
    a DTensor) and keeps the rank's rows (`_load_rows`). The hooks sit on each module that holds such a
    parameter itself, so they run whichever ancestor's state_dict() is asked."""
    from torch.distributed.tensor import DTensor
    holders = [m for m in root.modules() if m not in _EXPOSED
               and any(p in _FULL for p in m._parameters.values() if p is not None)]

    def hook(mod, state_dict, prefix, local_metadata) -> None:
        for name, p in mod._parameters.items():
            key, cut = prefix + name, (None if p is None else _FULL.get(p))
            if cut is not None and key in state_dict and not isinstance(state_dict[key], DTensor):
                state_dict[key] = DTensor.from_local(state_dict[key], cut.mesh, cut.placements,
                                                     run_check=False, shape=torch.Size(cut.shape), stride=cut.stride)
    for m in holders:
        m.register_state_dict_post_hook(hook)
        m.register_load_state_dict_pre_hook(_load_rows)
        _EXPOSED[m] = True


def _load_rows(mod, state_dict, prefix, *_) -> None:
    """Before `mod.load_state_dict`: a whole sharded parameter given (a tensor of its full shape, or a
    DTensor, gathered: every rank loads) becomes the rank's rows; anything else is left for torch's checks."""
    from torch.distributed.tensor import DTensor
    for name, p in mod._parameters.items():
        key, cut = prefix + name, (None if p is None else _FULL.get(p))
        value = state_dict.get(key)
        if cut is None or not isinstance(value, torch.Tensor):
            continue
        if isinstance(value, DTensor):
            value = value.full_tensor()
        if tuple(value.shape) == cut.shape:
            state_dict[key] = cut.piece(value)


def full_tensor(p: torch.Tensor) -> torch.Tensor:
    """The whole of a parameter this path sharded (an all-gather over its fsdp group: every rank must call
    it, in the same order), or `p` itself if it is not sharded."""
    cut = _FULL.get(p)
    if cut is None:
        return p.detach()
    return cut.whole(p.detach())


_TORCH_CLIP = torch.nn.utils.clip_grad.clip_grad_norm_     # torch's own, before any route is installed
CLIPPED = counters.counter("gradient clips whose norm summed sharded gradients over their fsdp groups")


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach: bool | None = None) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_, also for parameters this path sharded in place: the norm is the
    whole gradient's (each sharded parameter's rows are summed over its fsdp group), the same on every
    rank, which must all call it with the same parameters. Without sharded parameters it is torch's.
    Once a parameter is cut, torch.nn.utils.clip_grad_norm_ itself comes here (`compat.route_clip_grad_norm`)."""
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    with_grad = [p for p in params if p.grad is not None]
    if not any(p in _FULL for p in with_grad):
        return _TORCH_CLIP(params, max_norm, norm_type, error_if_nonfinite, foreach)
    CLIPPED["clip_grad_norm_"] += 1
    norm_type = float(norm_type)
    infinite = norm_type == float("inf")
    parts: dict[str | None, list[torch.Tensor]] = {}     # fsdp group (None: whole on every rank) -> norms
    for p in with_grad:
        g = p.grad.detach()
        g = g.full_tensor() if hasattr(g, "full_tensor") else g
        norm = torch.linalg.vector_norm(g.float(), norm_type) if g.numel() else g.new_zeros((), dtype=torch.float32)
        cut = _FULL.get(p)
        if cut is not None and cut.groups is None:    # a tp cut: the whole gradient's norm (gathered)
            norm = torch.linalg.vector_norm(cut.whole(g).float(), norm_type)
        parts.setdefault(None if cut is None or cut.groups is None else cut.groups.fsdp_group, []).append(norm)
    total = None
    for group, norms in sorted(parts.items(), key=lambda kv: kv[0] or ""):
        stacked = torch.stack(norms)
        part = stacked.max() if infinite else stacked.pow(norm_type).sum()
        if group is not None:
            part = compat.collective("all_reduce", part, "max" if infinite else "sum", group)
        total = part if total is None else (torch.maximum(total, part) if infinite else total + part)
    total = total if infinite else total.pow(1.0 / norm_type)
    if error_if_nonfinite and not torch.isfinite(total):
        raise RuntimeError(f"colauto: the total norm of order {norm_type} of the gradients is non-finite, so it "
                           "cannot be clipped; pass error_if_nonfinite=False to clip anyway")
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    with torch.no_grad():
        for p in with_grad:
            p.grad.mul_(coef.to(p.grad.device, p.grad.dtype))
    return total
