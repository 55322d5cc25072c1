"""Data parallelism on the captured graph: DDP's semantics with the reductions in the compiled graph.

Each rank runs the graph Dynamo captured on its own micro-batch, with the user's Parameter objects as
they are (nothing is swapped, wrapped or sharded, so optimizers, `state_dict()` and checkpoints see
plain tensors). Two rewrites of the joint forward+backward graph, before planning and partitioning:

- each parameter gradient the graph returns becomes the mean over the ranks (a functional all-reduce,
  issued where the gradient is produced, waited for where it leaves the graph), as DDP averages them;
- each 0-dim floating output (a loss) becomes the mean over the ranks in the forward, its gradient
  untouched: with equal micro-batches a mean loss is the global batch's, as one process would print it,
  and the gradients are the global batch's too (each rank's is its own part; the all-reduce averages).

A parameter used by several graphs (a graph break) gets each graph's part reduced by that graph, which
sums to the whole gradient's mean. A parameter only code Dynamo ran eagerly reads (after a graph break)
has its gradient averaged by a hook, as DDP does (`check_eager_gradients`). At the first compile each
parameter and buffer a graph reads, and the compiled module's parameters, are broadcast from rank 0, as
DDP does at construction.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import weakref
from typing import Callable

import torch
import torch.distributed as dist
import torch.fx as fx
from torch.utils.weak import WeakIdKeyDictionary

from .. import _torch_compat as compat
from .. import counters, report

aten = torch.ops.aten
_BROADCAST = WeakIdKeyDictionary()     # tensor -> True once it was made equal on every rank
_IN_GRAPHS = WeakIdKeyDictionary()     # parameter -> True once a compiled graph got it (and so averages it)
_CHECKED = WeakIdKeyDictionary()       # parameter -> True once it carries _average_eager
UNCHECKED = counters.counter("data-parallel graphs whose eager gradients are not checked")
MIXED = counters.counter("gradients with parts from both compiled graphs and eager code, averaged by a hook")
SAME_CHECKED = counters.counter("gradients checked to be the same on every rank (once a parameter)")
EAGER_AVERAGED = counters.counter("gradients averaged over the ranks outside the compiled graphs (code Dynamo ran eagerly)")


@dataclasses.dataclass(frozen=True)
class DataParallel:
    """The data-parallel group a graph's gradients are averaged over."""
    world: int
    group_name: str
    # False where something else reduces the gradients (a sharded module's parameter reads, parallel/emit.py):
    # only the losses are averaged
    reduce_grads: bool = True
    # primal positions whose gradient something else reduces (a shard's: parallel/fsdp.py's gather)
    not_reduced: frozenset[int] = frozenset()

    @classmethod
    def world_group(cls, reduce_grads: bool = True) -> "DataParallel":
        return cls(dist.get_world_size(), compat.process_group_name(dist.group.WORLD), reduce_grads)


def prepare(gm: fx.GraphModule, example_inputs: list, dp: DataParallel) -> None:
    """Before a graph is compiled: every rank must average the same parameters in the same order (else
    the collectives would pair up wrongly and hang), and its parameters and buffers start as rank 0's.
    The graph's code itself may differ between ranks (symbolic sizes are named by value coincidences)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    state = [(compat.raw_source_name(n), tuple(t.shape)) for n, t in zip(placeholders, example_inputs)
             if isinstance(t, torch.nn.Parameter)]
    mine = hashlib.sha1(repr(state).encode()).hexdigest()[:16]
    every = [None] * dp.world
    dist.all_gather_object(every, mine)
    if len(set(every)) > 1:
        groups = {d: [r for r, x in enumerate(every) if x == d] for d in set(every)}
        raise RuntimeError(f"colauto: the ranks compiled graphs of different parameters (digest of their names "
                           f"and shapes -> ranks: {groups}); give every rank the same model and COLAUTO_* settings")
    with torch.no_grad():
        for node, t in zip(placeholders, example_inputs):
            if isinstance(t, torch.Tensor) and _is_state(node, t) and t not in _BROADCAST:
                dist.broadcast(t.data, src=0)
                _BROADCAST[t] = True


def check_eager_gradients(module: torch.nn.Module, gm: fx.GraphModule, compiled, example_inputs: list,
                          cut: Callable[[torch.Tensor], bool] = lambda p: False):
    """`compiled`, with DDP's treatment of a gradient that comes from code Dynamo ran outside the compiled
    graphs (after some graph breaks: one inside a forward hook left HF Llama's embedding eager; OPT under
    transformers 5.17 breaks in every decoder layer). Nothing in a graph averages such a gradient over the
    ranks, so each trainable parameter of `module` gets a hook on its incoming gradient: where no compiled
    graph read the parameter, the gradient is averaged over the ranks there, as DDP's hooks do (one
    all-reduce a parameter, in the backward; counted). A parameter `cut` says holds only this rank's rows
    (parallel/fsdp.py) gave eager code its rows, not the whole weight, so its backward fails in one line
    instead. The module's parameters start as rank 0's (as DDP broadcasts them), those no graph read too.
    Graphs note their parameters at each call, not at compile: Dynamo runs one compiled graph for several
    modules' parameters (a graph break in each layer). An eager contribution to a parameter some graph also
    reads cannot be averaged apart (the hook sees the sum of both), but the graph's part is the same on
    every rank, so averaging the sum gives the right mean: such a gradient differs between the ranks, which
    `_check_same` finds in the parameter's first backwards; from then on its hook averages it too."""
    for p in gm.parameters():                  # attributes of the graph (AOTAutograd lifts them)
        _IN_GRAPHS[p] = True
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p not in _BROADCAST and not cut(p):
                dist.broadcast(p.data, src=0)
                _BROADCAST[p] = True
            if p.requires_grad and p not in _CHECKED:
                _CHECKED[p] = True
                p.register_hook(functools.partial(_average_eager, name, weakref.ref(p), cut))
    at = [i for i, t in enumerate(example_inputs) if isinstance(t, torch.nn.Parameter)]
    seen = [None] * len(at)          # the parameters of the last call: noted again only when they change

    @functools.wraps(compiled)
    def run(*args):
        for k, i in enumerate(at):
            if args[i] is not seen[k]:
                _IN_GRAPHS[args[i]] = True
                seen[k] = args[i]
        return compiled(*args)
    return run


def _average_eager(name: str, ref: weakref.ref, cut: Callable[[torch.Tensor], bool], grad: torch.Tensor):
    """A gradient on its way into `ref()`: the mean over the ranks where no compiled graph read the parameter,
    or where eager code also adds to it (`_MIXED`); a cut parameter read eagerly fails in one line; else
    unchanged (the graphs averaged it), checked to be the same on every rank in its first `SAME_CHECKS`
    backwards that found it so (`_check_same`)."""
    p = ref()
    if p is None:
        return None
    if p in _IN_GRAPHS and p not in _MIXED:
        if not cut(p) and _SAME.get(p, 0) < SAME_CHECKS:
            _check_same(name, p, grad)
        return None
    if cut(p):
        raise RuntimeError(f"colauto: the gradient of {name} comes from code that ran outside the compiled graphs "
                           "(after a graph break, Dynamo ran it eagerly) on this rank's rows of the parameter, "
                           "which FSDP cut in place; remove the graph break (TORCH_LOGS=graph_breaks names it) "
                           "or set COLAUTO_MESH=dp=N")
    return _mean(name, grad.contiguous().clone())


def _mean(name: str, t: torch.Tensor) -> torch.Tensor:
    """`t` averaged over the ranks, in place. A part that is already the same on every rank (a graph's
    averaged gradient) stays as it is, so a sum of such a part and an eager one becomes the right mean."""
    dist.all_reduce(t)
    EAGER_AVERAGED[name] += 1
    return t.div_(dist.get_world_size())


# A gradient the graphs made is compared across the ranks until it was seen equal this many times: a tp plan's
# layers on the tp group's whole batch compute their parameters' gradients on every rank (no collective
# after), and HF GPT-NeoX's, under codegen inductor, came out apart in the last bits first at its second step
SAME_CHECKS = 3
_SAME = WeakIdKeyDictionary()       # parameter -> how many backwards saw its gradient equal on every rank
_MIXED = WeakIdKeyDictionary()      # parameter -> True: eager code adds to what a graph averaged (a tied weight)
_PENDING: list[tuple[str, torch.Tensor, torch.Tensor]] = []   # this backward's (name, parameter, checksums)


def _check_same(name: str, p: torch.Tensor, grad: torch.Tensor) -> None:
    """In the first backwards of a parameter a compiled graph reads: its gradient must be the same on every
    rank (the graphs' all-reduces give every rank the same mean). Where it is not, code Dynamo ran eagerly
    added a part no graph averaged (a weight read by a graph and, tied, eagerly: HF OPT's embedding under
    transformers 5.17), or the ranks computed it apart (a tp layer on the tp group's whole batch: the last
    bits, HF GPT-NeoX under codegen inductor). The checksums go in one collective at the backward's end
    (`_compare_pending`)."""
    g = grad.detach()       # no copy of it: a float64 one of a 2 GB embedding gradient would not fit at the peak
    sums = (torch.stack([g.sum(dtype=torch.float64), g.amax().double(), g.amin().double()]) if g.numel()
            else g.new_zeros(3, dtype=torch.float64))
    _PENDING.append((name, p, sums))     # on the gradient's device, where the group's collectives run
    compat.at_backward_end(_compare_pending)    # each time: a backward that failed never ran its callbacks


def _compare_pending() -> None:
    """The pending checksums compared across the ranks. A parameter whose gradient differs is averaged now (its
    accumulated gradient: the mean keeps what is already equal everywhere) and, from then on, by its hook;
    rank 0 names the first such parameter once."""
    pending = list(_PENDING)
    _PENDING.clear()
    if not pending:         # an earlier callback of this backward compared them
        return
    sums = torch.stack([c for _, _, c in pending])
    both = torch.cat([sums, -sums])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    most, least = both[: len(pending)].cpu(), -both[len(pending):].cpu()
    differ = []
    for (name, p, _), a, b in zip(pending, most, least):
        if torch.equal(a, b):
            _SAME[p] = _SAME.get(p, 0) + 1
            continue
        _MIXED[p] = True
        differ.append(name)
        if p.grad is not None:
            with torch.no_grad():
                _mean(name, p.grad)
    SAME_CHECKED["parameters"] += len(pending)
    MIXED["parameters"] += len(differ)
    if differ and report._rank() == 0:
        print(f"colauto: the gradient of {differ[0]} ({len(differ)} parameters) differs between the ranks after "
              "the compiled graphs made it (code Dynamo ran eagerly after a graph break adds to it, or the ranks "
              "computed it apart): averaged over the ranks outside the graphs too, each step", flush=True)


def _is_state(node: fx.Node, t: torch.Tensor) -> bool:
    """A parameter, or a module buffer (by Dynamo's source of the input)."""
    return isinstance(t, torch.nn.Parameter) or "._buffers[" in (compat.raw_source_name(node) or "")


def reduce_gradients(joint: fx.GraphModule, *, num_fwd_outputs: int, param_indices: list[int],
                     dp: DataParallel) -> int:
    """Rewrite the joint graph in place (see the module docstring); the number of gradients reduced."""
    graph = joint.graph
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    outs = list(output.args[0])
    done = 0
    for i in (param_indices if dp.reduce_grads else ()):
        if i in dp.not_reduced:
            continue
        j = num_fwd_outputs + i
        if j < len(outs) and isinstance(outs[j], fx.Node):
            outs[j] = _mean_over_ranks(graph, outs[j], dp, wait_at_end=True)
            done += 1
    for j in range(num_fwd_outputs):
        if _is_scalar_float(outs[j]):   # in the forward: the partitioner splits the graph where it ends
            outs[j] = _mean_over_ranks(graph, outs[j], dp, wait_at_end=False)
    output.args = (tuple(outs) if isinstance(output.args[0], tuple) else outs,)
    joint.recompile()
    return done


def average_scalar_outputs(gm: fx.GraphModule, dp: DataParallel) -> None:
    """An inference graph's 0-dim floating outputs (an evaluation loss) as the mean over the ranks."""
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    outs = list(output.args[0])
    for j, node in enumerate(outs):
        if _is_scalar_float(node):
            outs[j] = _mean_over_ranks(gm.graph, node, dp, wait_at_end=False)
    output.args = (tuple(outs) if isinstance(output.args[0], tuple) else outs,)
    gm.recompile()


def _is_scalar_float(node) -> bool:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return isinstance(val, torch.Tensor) and val.dim() == 0 and val.dtype.is_floating_point


def _mean_over_ranks(graph: fx.Graph, node: fx.Node, dp: DataParallel, *, wait_at_end: bool) -> fx.Node:
    """all_reduce(node, sum) / world, the collective issued right after `node` exists; with `wait_at_end`
    waited for at the end of the graph, so it runs while the rest of the graph computes (as DDP's buckets
    do), else at once."""
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    with graph.inserting_after(node):
        start = graph.call_function(compat.all_reduce_op(), (node, "sum", dp.group_name))
    with graph.inserting_before(output if wait_at_end else start.next):
        done = graph.call_function(compat.wait_tensor_op(), (start,))
        mean = graph.call_function(aten.div.Tensor, (done, dp.world))
    for new in (start, done, mean):
        new.meta.update({k: v for k, v in node.meta.items() if k not in ("val", "tensor_meta")})
        new.meta["val"] = compat.fake_like(node.meta["val"])
    return mean
