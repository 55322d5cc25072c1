"""Outputs returned beside the loss, whose gradient the step never asks for (an HF model's logits).

`model(input_ids=x, labels=x)` returns the loss and the logits; the user calls `loss.backward()`.
The compiled step is one autograd node with both outputs, and autograd hands its backward a gradient
for every output: for the logits, a zero tensor it allocates and fills (`materialize_grads`), the
size of the logits (HF Qwen2-0.5B at 8x1024: 2.37 GiB in bf16), held until the backward returns,
and read by the backward, which adds it to the logits' gradient. torch.compile's own path does the
same.

colauto compiles such a graph's backward with those gradients as zeros instead (`specialize`: the
tangent inputs are left unread, Inductor folds the zeros away), and tells autograd not to make them
(`expect_unused`, after each forward): neither the buffer nor its fill nor its read exists.

Which outputs (`decide`): in a training graph whose floating outputs with a gradient are one 0-dim
output (the loss) and others, all of static shape, the others. If a gradient does reach
one of them (`(loss + logits.logsumexp(-1).mean()).backward()`), a hook on that output raises
`UnusedGradError` before the backward runs: the step fails loudly instead of dropping that gradient.
`options={"output_grads": "all"}` (COLAUTO_OUTPUT_GRADS=all; the default is `loss`) compiles the
general backward instead.
With dynamic shapes the zeros' symbolic sizes are read from the backward's own inputs (`_sizes`). On
several ranks, data-parallel and FSDP graphs (plain outputs) are specialized too: each rank's loss
gradient is its own, and the logits' gradients were never averaged. Graphs with DTensor outputs (tensor
parallelism) or CUDA graphs keep the general backward (counted).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from . import _torch_compat as compat
from . import counters
from .cost import memory

UNUSED = memory.UNUSED_GRAD       # a tangent placeholder's meta: autograd passes None for it
SPECIALIZED = counters.counter("backward graphs without the gradients of outputs beside the loss")
KEPT = counters.counter("backward graphs that keep every output's gradient")


class UnusedGradError(RuntimeError):
    """A gradient reached an output colauto compiled as having none."""


Shape = tuple  # an output's sizes: an int per static dimension, the size's expression (str) per symbolic one


def _shape(t: torch.Tensor) -> Shape:
    return tuple(str(s) if isinstance(s, torch.SymInt) else int(s) for s in t.shape)


def _rule(vals: list) -> tuple[Shape, ...] | None:
    """Of the floating tensors that get a gradient: where exactly one is 0-dim (the loss), the shapes of the
    others (maybe none); else None."""
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return None
    if sum(v.dim() == 0 for v in vals) != 1:
        return None
    return tuple(_shape(v) for v in vals if v.dim() > 0)


def _matches(shape: Sequence[int], key: Shape) -> bool:
    """A run-time output's sizes against a decided shape (a symbolic size matches any)."""
    return len(shape) == len(key) and all(isinstance(k, str) or k == s for s, k in zip(shape, key))


def _is_dtensor(t: torch.Tensor) -> bool:
    if type(t) is torch.Tensor or not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor
    return isinstance(t, DTensor)


def decide(gm: fx.GraphModule, reason: str | None) -> tuple[Shape, ...]:
    """From the Dynamo graph, before AOTAutograd: the shapes of the outputs to compile without a gradient
    (none where `reason` says why not, or the rule does not hold: counted). Decided here, not on the
    joint graph, so that a step loaded from torch's compile cache (no joint graph) decides the same."""
    outputs = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    vals = [n.meta.get("example_value") for n in (outputs if isinstance(outputs, (list, tuple)) else [outputs])
            if isinstance(n, fx.Node)]
    graded = [v for v in vals if isinstance(v, torch.Tensor) and v.requires_grad and v.is_floating_point()]
    # an output that is a view gets its gradient through its base's tangent (AOTAutograd's intermediate
    # bases), whose shape is not the output's: only graphs without such outputs, so that the joint
    # graph's tangents are these outputs' (`mark` agrees, also for a step loaded from the compile cache)
    if any(v._is_view() for v in graded):
        return ()
    shapes = _rule(graded) or ()
    if reason is None and any(_is_dtensor(v) for v in graded):
        reason = "DTensor outputs (tensor parallelism)"     # their tangents are DTensors: not specialized
    if shapes and reason is not None:
        KEPT[reason] += 1
        return ()
    return shapes


def mark(joint: fx.Graph, shapes: tuple[Shape, ...]) -> bool:
    """Mark the joint graph's tangents of the outputs `decide` chose (every tangent but the loss's, where
    the tangents are those outputs' and the loss's; otherwise none, counted). Whether any was marked."""
    if not shapes:
        return False
    tangents = [n for n in joint.nodes if n.op == "placeholder" and n.name.startswith("tangents")]
    if sorted(map(repr, _rule([n.meta.get("val") for n in tangents]) or ())) != sorted(map(repr, shapes)):
        KEPT["tangents other than the outputs'"] += 1
        return False
    for n in tangents:
        if n.meta["val"].dim() > 0:
            n.meta[UNUSED] = True
    return True


def specialize(bw: fx.GraphModule, inputs: list) -> list:
    """In a partitioned backward graph, every marked tangent's readers read zeros of its size instead. The
    placeholder stays, unread, so the graph's signature is AOTAutograd's, and it becomes an int input
    (example 0): Inductor then neither checks its size nor its alignment, and takes autograd's None.
    Returns `inputs` with those examples replaced."""
    placeholders = [n for n in bw.graph.nodes if n.op == "placeholder"]
    after = placeholders[-1] if placeholders else None
    replaced = []
    for i, ph in enumerate(placeholders):
        if not ph.meta.get(UNUSED) or not isinstance(ph.meta.get("val"), torch.Tensor):
            continue
        val = ph.meta["val"]
        sizes, after = _sizes(bw, placeholders, val, after)
        with bw.graph.inserting_after(after):
            zeros = bw.graph.call_function(torch.ops.aten.full.default, (sizes, 0),
                                           {"dtype": val.dtype, "layout": torch.strided, "device": val.device,
                                            "pin_memory": False})
        zeros.meta.update({k: v for k, v in ph.meta.items() if k != UNUSED})
        zeros.meta["val"] = val.new_zeros(val.shape)
        ph.replace_all_uses_with(zeros)
        ph.meta["val"] = 0
        after = zeros
        replaced.append(i)
    if not replaced:
        return inputs
    bw.recompile()
    SPECIALIZED["backward graphs"] += 1
    return [0 if i in replaced else x for i, x in enumerate(inputs)]


def _sizes(bw: fx.GraphModule, placeholders: list[fx.Node], val: torch.Tensor, after: fx.Node) -> tuple[list, fx.Node]:
    """`val`'s sizes as `full`'s argument in the backward graph: ints, and for a symbolic size the node that
    gives it at run time (a SymInt input of the backward, or the size of a tensor input that is not a
    tangent). The last node inserted (or `after`)."""
    sizes = []
    for s in val.shape:
        if not isinstance(s, torch.SymInt):
            sizes.append(int(s))
            continue
        want = str(s)
        source = next((p for p in placeholders if isinstance(p.meta.get("val"), torch.SymInt)
                       and str(p.meta["val"]) == want), None)
        if source is None:
            owner = next(((p, d) for p in placeholders if not p.name.startswith("tangents")
                          and isinstance(p.meta.get("val"), torch.Tensor)
                          for d, x in enumerate(p.meta["val"].shape) if str(x) == want), None)
            if owner is None:
                raise RuntimeError(f"colauto: the backward graph has no input giving the size {want} of an output "
                                   "compiled without its gradient; set COLAUTO_OUTPUT_GRADS=all and report this")
            with bw.graph.inserting_after(after):
                source = bw.graph.call_function(torch.ops.aten.sym_size.int, owner)
            source.meta["val"] = s
            after = source
        sizes.append(source)
    return sizes, after


def expecting_unused(compiled: Callable, shapes: Sequence[Shape]) -> Callable:
    """`compiled` (AOTAutograd's step, boxed or not), calling `expect_unused` on its outputs each time."""
    def run(*args):
        outputs = compiled(*args)
        expect_unused(outputs, shapes)
        return outputs
    run._boxed_call = getattr(compiled, "_boxed_call", False)
    return run


def expect_unused(outputs: Any, shapes: Sequence[Shape]) -> None:
    """After the compiled forward: autograd is not to make zero gradients for the step's outputs (its
    node's `materialize_grads`), and a gradient that reaches an output of a marked shape raises."""
    tensors = [t for t in (outputs if isinstance(outputs, (list, tuple)) else [outputs])
               if isinstance(t, torch.Tensor) and t.requires_grad]
    if not compat.skip_zero_grads(tensors):
        return
    for t in tensors:
        if t.dim() > 0 and any(_matches(t.shape, key) for key in shapes):
            t.register_hook(_refuse(tuple(t.shape)))


def _refuse(shape: tuple[int, ...]):
    def hook(grad):
        if grad is None:      # autograd calls an output's hooks with None where no gradient reached it
            return None
        raise UnusedGradError(
            f"colauto: a gradient reached a compiled output of shape {list(shape)} returned beside the loss, "
            f"whose backward colauto compiled without it (to skip autograd's zero gradient for it); "
            f"compile with options={{'output_grads': 'all'}} or set COLAUTO_OUTPUT_GRADS=all")
    return hook
