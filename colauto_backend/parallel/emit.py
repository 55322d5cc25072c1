"""Emit a parallel plan: the module's parameters become DTensor parameters, and graphs use them.

The optimizer the script already built holds the original Parameter objects, and a Parameter cannot
become a DTensor in place (their slot layouts differ, so `torch.utils.swap_tensors` refuses). So each
original keeps only its local shard (`.data`), and the module gets a DTensor Parameter whose local
tensor is that same storage: the optimizer steps the shard, `state_dict()` shows DTensors, and
`torch.distributed.checkpoint` saves and loads them in place. Both hold the same gradient: the
DTensor parameter's `.grad` and, as its local tensor, the original's.

The first call runs the graph Dynamo captured before sharding, on the parameters gathered whole (one
data-parallel step: `Sharded.first_call`). After it, Dynamo sees DTensor parameters and re-traces the
user's code once. Reading a parameter gives it in its compute placement: without tensor parallelism
as a plain tensor (gathered; "plain mode", SimpleFSDP's way), so the user's code meets no DTensor;
with tp as a DTensor, and hooks on the root module turn the rank's micro-batch into a DTensor (sharded
on dim 0 over the whole mesh) and the outputs back into local tensors. Either way the re-traced graph
has the gathers in it, and AOTAutograd lowers it to a local graph whose collectives include the
gradient reductions (the backward of each gather or replicate).
"""
from __future__ import annotations

import functools
from typing import Callable
import warnings
import weakref

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten
from torch.utils.weak import WeakIdKeyDictionary

from .. import _torch_compat as compat
from .. import counters
from . import _dtensor_rules
from .plan import ParallelPlan

# ops DTensor has no sharding rule for, run replicated over tp by colauto's rule: op -> plans that did
REPLICATED_OPS = counters.counter("ops run replicated over tp")

_OWNER: WeakIdKeyDictionary = WeakIdKeyDictionary()   # DTensor parameter -> (Sharded, fqn)


def owner(t) -> "Sharded | None":
    """The Sharded that made `t` (a DTensor parameter), else None."""
    got = _OWNER.get(t) if isinstance(t, DTensor) else None
    return got[0] if got is not None else None


def activations_on_dtensors(plan: ParallelPlan) -> None:
    """What running a tp plan's activations as DTensors needs (here and in tp_graph.py): a plain tensor the
    model makes in forward (positions from arange, a rotary table from a buffer) is the same on every rank,
    i.e. replicated; a gathered query keeps its layout (HF attention's reshape); ops with no DTensor rule
    that the plan runs replicated get colauto's rule."""
    compat.allow_implicit_replication()
    _dtensor_rules.keep_local_layout()
    _dtensor_rules.strided_sizes_outside_fake_mode()
    _dtensor_rules.views_of_strided_shards()
    for name in plan.predicted.get("replicated_ops", ()):
        _dtensor_rules.run_replicated(_dtensor_rules.op_named(name))
        REPLICATED_OPS[name] += 1


def placements_of(spec: tuple[str, ...]) -> list:
    return [Replicate() if p == "R" else Shard(int(p[1:])) for p in spec]


class Sharded:
    """One module sharded by one plan."""

    def __init__(self, root: nn.Module, plan: ParallelPlan, mesh):
        self.root, self.plan, self.mesh = root, plan, mesh
        self.roles = [r for r, _ in plan.axes]
        self.dparam: dict[int, DTensor] = {}          # id(original tensor) -> its DTensor replacement
        self.grad_fallbacks = 0                        # gradients that arrived in another placement
        self.held: list[DTensor] = []                  # this forward's compiled graphs' outputs (holding_outputs)
        self.grad_pairs: list[tuple[weakref.ref, DTensor]] = []   # (original, its DTensor), one shared gradient
        self.compiled: dict[tuple, Callable] = {}      # its re-traced graphs (parallel/entry.py), compiled
        self.done = False
        # No tensor parallelism: every layer computes on full parameters. A parameter read gives a plain
        # tensor (gathered; its gradient each rank's part, averaged back into the shard), and the user's
        # code runs on plain tensors only, as SimpleFSDP does: no DTensor meets its buffers, masks or
        # positions. With tp, activations are DTensors too (sharded over tp), as before.
        self.plain = not plan.tensor_parallel

    def shard(self) -> None:
        """Replace the parameters (not from inside the backend: Dynamo checks its guards against the
        module right after the backend returns, so this runs at the first call)."""
        if not self.plain:
            activations_on_dtensors(self.plan)
        self._shard(self.root)
        if not self.plain:
            self._pin_tp_activations()
            self._pin_layer_places()
            self.root.register_forward_pre_hook(self._inputs_hook, with_kwargs=True)
            self.root.register_forward_hook(self._outputs_hook)
        self.done = True

    # -- parameters -------------------------------------------------------------------------------
    def _shard(self, root: nn.Module) -> None:
        earlier = [fqn for fqn, p in root.named_parameters() if owner(p) is not None]
        if earlier:
            # A graph after a graph break that reads parameters an earlier graph's plan already sharded
            # (transformers 5.17's OPT: a break in every decoder layer). Sharding them again split one
            # parameter's gradient over two DTensors, and OPT under dp=2 trained silently wrong.
            from ..config import ConfigError
            raise ConfigError(f"colauto: a graph after a graph break reads parameters that an earlier graph's "
                              f"parallel plan already sharded ({len(earlier)} of its module's, e.g. {earlier[0]}): several "
                              "graphs over one module's parameters are not supported under a mesh yet; remove "
                              "the graph break (TORCH_LOGS=graph_breaks names it) or train on one device")
        aliases: dict[int, list[str]] = {}
        for fqn, p in root.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(p), []).append(fqn)
        for fqn, p in root.named_parameters():
            # a tied parameter is planned under the name the graph read it by; one the graph never
            # read (used only after a graph break, or not at all) stays replicated
            fqn = next((a for a in aliases[id(p)] if a in self.plan.storage), fqn)
            spec = self._placements(self.plan.storage, fqn)
            full = distribute_tensor(p.detach(), self.mesh, spec)   # rank 0's values, as DDP broadcasts
            p.data = full.to_local()
            d = nn.Parameter(DTensor.from_local(p.data, self.mesh, spec, run_check=False,
                                                shape=full.shape, stride=full.stride()), p.requires_grad)
            if p.requires_grad:
                self._share_grads(p, d, spec)
            self.dparam[id(p)] = d
            _OWNER[d] = (self, fqn)
        for fqn, b in root.named_buffers():
            if not self.plain:    # plain code reads plain buffers
                self.dparam[id(b)] = distribute_tensor(b, self.mesh, [Replicate()] * len(self.roles))
        for mod in root.modules():
            for table in (mod._parameters, mod._buffers):
                for name, t in table.items():
                    if t is not None and id(t) in self.dparam:
                        table[name] = self.dparam[id(t)]
            _use_compute_placements(mod, self)

    def _pin_tp_activations(self) -> None:
        """Megatron's activations with sequence parallelism (along the batch dim), whatever DTensor's
        propagation would pick on its own: outside the tp regions activations stay sharded over tp
        like the micro-batches; a column module gathers its input over tp, a row module
        reduce-scatters its partial output back to batch shards. Plain hooks: Dynamo traces them."""
        modules = dict(self.root.named_modules())
        for fqn, role in self.plan.tp_modules.items():
            if role == "col":
                modules[fqn].register_forward_pre_hook(lambda m, args: (self._over_tp(args[0], Replicate()), *args[1:]))
            else:
                modules[fqn].register_forward_hook(lambda m, args, out: self._over_tp(out, Shard(0)))

    def _pin_layer_places(self) -> None:
        """Where the plan computes some layers redundantly over tp ("R": the tp group's whole batch on
        each of its ranks), each placed layer's input is moved to its placement on entry (gathered over
        tp for "R", cut back to the rank's batch shard for "S"), before any tp hook of the same module;
        the last placed layer's output leaves batch-sharded, as the planner costs it."""
        if not self.plan.layer_places or "tp" not in self.roles:
            return
        modules = dict(self.root.named_modules())
        for g, place in self.plan.layer_places.items():
            target = Replicate() if place == "R" else Shard(0)
            modules[g].register_forward_pre_hook(
                lambda m, args, target=target: (self._over_tp(args[0], target), *args[1:]) if args else args,
                prepend=True)
        last = list(self.plan.layer_places)[-1]
        modules[last].register_forward_hook(lambda m, args, out: self._over_tp(out, Shard(0)))

    def _over_tp(self, x, placement):
        if not isinstance(x, DTensor):
            return x
        return x.redistribute(self.mesh, [placement if r == "tp" else p for r, p in zip(self.roles, x.placements)])

    def _share_grads(self, original: torch.Tensor, d: DTensor, spec: list) -> None:
        """One gradient, two views: the DTensor parameter's `.grad` (what `model.parameters()` shows, so
        clip_grad_norm_ and an optimizer built after compiling see it) and the original Parameter's
        `.grad`, its local tensor (what an optimizer built before compiling steps). Whichever side the
        script clears (optimizer or module zero_grad), the next backward starts both afresh."""
        ref = weakref.ref(original)
        self.grad_pairs.append((ref, d))

        def before_accumulate(grad):
            o = ref()      # None once nothing holds the original (no optimizer was built before compiling)
            if o is not None and (d.grad is None or o.grad is None
                                  or o.grad.data_ptr() != d.grad.to_local().data_ptr()):
                d.grad, o.grad = None, None
            return grad

        def after_accumulate(param: DTensor) -> None:
            g = param.grad
            if tuple(g.placements) != tuple(spec):
                # The compiled graphs reduce gradients themselves (the backward of `redistribute`):
                # one that arrives unreduced is reduced here, counted, and reported once.
                self.grad_fallbacks += 1
                if self.grad_fallbacks == 1:
                    warnings.warn("colauto: a gradient left the compiled graph unreduced; reducing it "
                                  "outside the graph (slower); Sharded.grad_fallbacks counts them")
                param.grad = g = g.redistribute(self.mesh, spec)
            if (o := ref()) is not None:
                o.grad = g.to_local()
        d.register_hook(before_accumulate)
        d.register_post_accumulate_grad_hook(after_accumulate)

    # -- data ---------------------------------------------------------------------------------------
    def to_input(self, x):
        """A rank's micro-batch -> the global batch, sharded on dim 0 over the whole mesh."""
        if not isinstance(x, torch.Tensor) or isinstance(x, DTensor):
            return x
        place = Replicate() if x.dim() == 0 else Shard(0)
        d = DTensor.from_local(x, self.mesh, [place] * len(self.roles), run_check=False)
        # the first call traced the rank's micro-batch, this is the global one: without this Dynamo
        # would take the size change for a dynamic dim (DTensor's implicit replication cannot size those)
        compat.mark_static(d)
        return d

    def to_output(self, y):
        """Scalars (a mean loss: the global batch's) replicated; others back to the rank's micro-batch,
        whose gradient is averaged over the ranks as DDP does, so that a mean loss the script computes
        from them stays the global batch's mean."""
        if not isinstance(y, DTensor):
            return y
        if y.dim() == 0:
            return y.redistribute(self.mesh, [Replicate()] * len(self.roles)).to_local()
        return _RankPart.apply(y.redistribute(self.mesh, [Shard(0)] * len(self.roles)))

    # Hooks run eagerly: traced by Dynamo they would become graphs of their own.
    @torch.compiler.disable
    def _inputs_hook(self, module, args, kwargs):
        self.held.clear()
        return tree_map(self.to_input, args), tree_map(self.to_input, kwargs)

    @torch.compiler.disable
    def _outputs_hook(self, module, args, output):
        held, self.held = self.held, []
        return tree_map(self.to_output, _tie_to_loss(output, held))

    def release_cleared_grads(self) -> None:
        """A gradient the script cleared on one side (an optimizer built before compiling clears the
        originals, `model.zero_grad()` the DTensors) is dropped on the other side too: the two share one
        storage, which the other side's view would keep alive until backward replaces it (a whole local
        gradient copy held through the next forward)."""
        for ref, d in self.grad_pairs:
            o = ref()
            if o is not None and (o.grad is None) != (d.grad is None):
                o.grad = d.grad = None

    def releasing_cleared_grads(self, compiled: Callable) -> Callable:
        """`compiled` (a graph of this module's re-trace), run after `release_cleared_grads`."""
        def run(*args):
            self.release_cleared_grads()
            return compiled(*args)
        functools.update_wrapper(run, compiled)      # keeps `_boxed_call`
        return run

    def holding_outputs(self, compiled: Callable) -> Callable:
        """`compiled` (a graph of this module's re-trace), whose DTensor outputs that need gradients are
        held until the module's forward returns, to be tied to its loss (`_tie_to_loss`)."""
        def run(*args):
            out = compiled(*args)
            self.held.extend(t for t in tree_flatten(out)[0] if isinstance(t, DTensor) and t.requires_grad)
            return out
        functools.update_wrapper(run, compiled)      # keeps `_boxed_call`
        return run

    def compute_placements(self, fqn: str) -> list:
        """Where the graph uses parameter `fqn`."""
        return self._placements(self.plan.compute, fqn)

    def _placements(self, table: dict[str, tuple[str, ...]], fqn: str) -> list:
        """`table[fqn]` as placements; replicated for a parameter the plan never saw."""
        return placements_of(table.get(fqn, ("R",) * len(self.roles)))

    # -- the first call, before Dynamo has seen the DTensor parameters --------------------------------
    def first_call(self, compiled: Callable, example_inputs: list) -> Callable:
        """Shard, then run this call's captured graph (`compiled` for full parameters, each rank's
        micro-batch) on the parameters gathered whole: data parallelism for one step, the same gradient
        as any plan's (each rank's part averaged back into its shard), and exactly the outputs the
        captured graph returns. Later calls see the sharded module: Dynamo re-traces the user's code,
        whose parameter reads give the compute placements (and with tp, the hooks make the micro-batch
        and the activations DTensors). No frame is read and the backend is not re-entered."""
        originals = {i: t for i, t in enumerate(example_inputs) if isinstance(t, nn.Parameter)}

        @torch.compiler.disable
        def run(*args):
            if not self.done:
                self.shard()
            args = list(args)
            whole = [Replicate()] * len(self.roles)
            for i, t in originals.items():
                if id(t) in self.dparam:
                    args[i] = plain_read(self.dparam[id(t)], self.mesh, whole)
            return compiled(*args)
        return run


def plain_read(d: DTensor, mesh, placements: list) -> torch.Tensor:
    """`d` in `placements` as a plain tensor whose gradient (each rank's part of the batch's) is averaged
    over the ranks on its way back into `d`'s placement (reduce-scatter / all-reduce)."""
    return d.redistribute(mesh, placements).to_local(grad_placements=[Partial("avg")] * len(placements))


def _tie_to_loss(output, held: list | None = None):
    """A model that returns its loss and other outputs that need gradients (a transformers ModelOutput:
    loss and logits) but whose script backpropagates the loss alone: AOTAutograd's compiled graph then
    gets no gradient for those DTensor outputs and cannot make one of the right type (autograd makes the
    missing one a plain zero tensor, which AOTAutograd refuses: "Expected a DTensor tangent but got a
    plain Tensor"). Adding zero times each one's sum to the loss gives each a (zero) DTensor gradient;
    the loss's value is unchanged. `held`: the DTensor outputs of the forward's compiled graphs
    (`Sharded.held`), tied the same way: a graph before a graph break returns what the code after the
    break still holds, which the loss may never use (GPT-2's last hidden state, held across the break
    in its loss function's logging)."""
    leaves, spec = tree_flatten(output)
    dts = [i for i, t in enumerate(leaves) if isinstance(t, DTensor) and t.requires_grad]
    losses = [i for i in dts if leaves[i].dim() == 0]
    if len(losses) != 1:
        return output
    ids = {id(leaves[i]) for i in dts}
    extra = [t for t in held or () if t.requires_grad and id(t) not in ids]
    if len(dts) < 2 and not extra:
        return output
    loss = leaves[losses[0]]
    for t in [leaves[i] for i in dts if i != losses[0]] + extra:
        loss = loss + _zero_of(t)
    leaves[losses[0]] = loss
    return tree_unflatten(leaves, spec)


def _zero_of(t: DTensor) -> DTensor:
    """A replicated scalar zero whose gradient reaches `t` (as zeros), with no communication: made from
    the rank's local part (a sharded output's sum would be Partial(sum), the loss's mean Partial(avg), and
    torch 2.11 cannot turn one into the other), and selected by `where`, not multiplied by 0, so an inf
    in `t` gives no NaN."""
    local = t.to_local().sum()
    zero = torch.where(torch.zeros((), dtype=torch.bool, device=local.device), local, torch.zeros_like(local))
    return DTensor.from_local(zero, t.device_mesh, [Replicate()] * t.device_mesh.ndim, run_check=False)


class _RankPart(torch.autograd.Function):
    """A batch-sharded DTensor -> this rank's local part; backward averages over the ranks."""

    @staticmethod
    def forward(ctx, y: DTensor) -> torch.Tensor:
        ctx.spec = (y.device_mesh, y.placements, y.shape, y.stride())
        return y.to_local()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> DTensor:
        mesh, placements, shape, stride = ctx.spec
        return DTensor.from_local(grad / mesh.size(), mesh, placements, run_check=False, shape=shape, stride=stride)


def _use_compute_placements(module: nn.Module, sharded: Sharded) -> None:
    """Reading `module.weight` now gives the parameter in its compute placement (an fsdp axis gathered),
    in eager code and in what Dynamo traces alike. A per-module subclass with one property per
    parameter: `_parameters` and so `state_dict()` keys are unchanged. The placements are closure
    constants, so Dynamo traces the property inline (a lookup table would break the graph)."""
    specs = {n: sharded.compute_placements(_OWNER[p][1])
             for n, p in module._parameters.items() if p is not None and p in _OWNER}
    if not specs:
        return

    def getter(name, mesh, placements):
        if sharded.plain:
            return property(lambda self: plain_read(self._parameters[name], mesh, placements))
        return property(lambda self: self._parameters[name].redistribute(mesh, placements))
    cls = module.__class__
    module.__class__ = type(cls.__name__, (cls,), {n: getter(n, sharded.mesh, pl) for n, pl in specs.items()})
