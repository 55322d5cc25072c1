"""COLAUTO_CODEGEN=triton: aten's cross-entropy pairs in the joint graph -> the hand-written kernels.

aten runs a mean cross-entropy as `_log_softmax` then `nll_loss_forward`, and its backward as
`nll_loss_backward` then `_log_softmax_backward_data`, each pair materializing an [N, V] tensor (the
log-probabilities, saved for backward; then their gradient). `triton_kernels.cross_entropy` computes
the loss with an online logsumexp and the gradient in one pass from the logits and the [N] logsumexp,
so the rewrite (on the joint graph, before partitioning, so the partitioner saves logits and lse
instead of the log-probabilities) removes both [N, V] intermediates. Only the pattern the kernels
implement is rewritten (2-D logits, class dim 1, no weights, mean reduction); anything else is left
to aten.
"""
from __future__ import annotations

import operator
from typing import NamedTuple

import torch
import torch.fx as fx

import triton_kernels
from triton_kernels import cross_entropy as ce

from . import _torch_compat as compat
from .chunked_loss import VIEWS as _VIEWS, is_cast as _is_cast, items as _items, view_chain_below as _view_chain_below

aten = torch.ops.aten
# The ops `rewrite` matches: a trace that decomposes (Inductor's table, where Inductor compiles the rest)
# keeps these whole, so the loss is found; what is not rewritten is decomposed by Inductor's re-trace.
MATCHED = (aten._log_softmax.default, aten._log_softmax_backward_data.default, aten.nll_loss_forward.default,
           aten.nll_loss_backward.default)


@torch.library.custom_op("colauto::cross_entropy_fwd", mutates_args=())
def cross_entropy_fwd(logits: torch.Tensor, target: torch.Tensor, ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    return ce.cross_entropy_forward(logits, target, ignore_index)


@cross_entropy_fwd.register_fake
def _(logits, target, ignore_index):
    return logits.new_empty((), dtype=torch.float32), logits.new_empty(logits.shape[:1], dtype=torch.float32)


@torch.library.custom_op("colauto::cross_entropy_bwd", mutates_args=())
def cross_entropy_bwd(grad: torch.Tensor, logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor,
                      ignore_index: int) -> torch.Tensor:
    return ce.cross_entropy_backward(grad, logits, target, lse, ignore_index)


@cross_entropy_bwd.register_fake
def _(grad, logits, target, lse, ignore_index):
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


def rewrite(joint: fx.GraphModule) -> int:
    """Replace every matching pair in `joint` in place; the number replaced."""
    if not triton_kernels.available():
        return 0            # fusion.fuse says why, once
    done = 0
    for lp in [n for n in joint.graph.nodes if n.target is aten._log_softmax.default]:
        done += _replace(joint.graph, lp)
    if done:
        joint.graph.eliminate_dead_code()
        joint.recompile()
    return done


def _replace(graph: fx.Graph, lp: fx.Node) -> int:
    logits, dim = lp.args[0], lp.args[1]
    logits_val = logits.meta.get("val")
    if not isinstance(logits_val, torch.Tensor) or logits_val.dim() != 2 or dim not in (1, -1):
        return 0
    if logits_val.device.type != "cuda" and not triton_kernels.interpreting():
        return 0       # compiled Triton kernels need CUDA tensors
    # the backward reads lp through detaches (aten's trace) or directly (Inductor's table drops them)
    direct = [u for u in lp.users if u.target is aten._log_softmax_backward_data.default]
    readers = [u for u in lp.users if u.target is not aten.detach.default and u not in direct]
    fwd = [u for u in readers if u.target is aten.nll_loss_forward.default]
    bwd = [u for u in readers if u.target is aten.nll_loss_backward.default]
    if len(fwd) != 1 or len(readers) != len(fwd) + len(bwd) or len(bwd) > 1:
        return 0
    nll = fwd[0]
    _, target, weight, reduction, ignore = nll.args
    try:
        ce.check(logits_val, target.meta["val"], weight=weight, reduction=reduction)
    except triton_kernels.NotFusible:
        return 0
    loss, total = _items(nll)
    grads = []
    if bwd:   # nll_loss_backward -> _log_softmax_backward_data, whose `output` is lp through detaches
        users = list(bwd[0].users)
        if len(users) != 1 or users[0].target is not aten._log_softmax_backward_data.default:
            return 0
        grads = [bwd[0], users[0]]
    if any(u not in grads for u in direct):
        return 0
    if total is not None and any(u not in grads[:1] for u in total.users):
        return 0
    narrow = _narrow_source(logits, lp, grads)
    if narrow is not None:
        logits = _replay(graph, narrow.x, narrow.views, logits)
        logits_val = logits.meta["val"]
    with graph.inserting_after(nll):
        fused = graph.call_function(torch.ops.colauto.cross_entropy_fwd.default, (logits, target, ignore))
        fused.meta["val"] = compat.fake_call(cross_entropy_fwd, logits_val, target.meta["val"], ignore)
    with graph.inserting_after(fused):
        new_loss = graph.call_function(operator.getitem, (fused, 0))
        new_loss.meta["val"] = fused.meta["val"][0]
        lse = graph.call_function(operator.getitem, (fused, 1))
        lse.meta["val"] = fused.meta["val"][1]
    out = new_loss
    if loss is not None and loss.meta["val"].dtype != torch.float32:   # aten keeps the logits' dtype
        with graph.inserting_after(lse):
            out = graph.call_function(aten._to_copy.default, (new_loss,), {"dtype": loss.meta["val"].dtype})
            out.meta["val"] = loss.meta["val"]
    if loss is not None:
        loss.replace_all_uses_with(out)
    for n in (fused, new_loss, lse, out):   # the partitioner reads forward/backward tags off meta
        n.meta.update({k: v for k, v in nll.meta.items() if k != "val"})
    if grads:
        nll_bwd, lsm_bwd = grads
        with graph.inserting_after(lsm_bwd):
            g = graph.call_function(torch.ops.colauto.cross_entropy_bwd.default, (nll_bwd.args[0], logits, target, lse, ignore))
            g.meta.update(lsm_bwd.meta)
        if narrow is None:
            lsm_bwd.replace_all_uses_with(g)
        else:   # the gradient comes out in the narrow dtype: it replaces the casts back to it
            g.meta["val"] = compat.fake_call(cross_entropy_bwd, nll_bwd.args[0].meta["val"], logits_val,
                                  target.meta["val"], lse.meta["val"], ignore)
            for views, cast in narrow.casts:
                cast.replace_all_uses_with(_replay(graph, g, views, g))
    return 1


def _narrow_source(logits: fx.Node, lp: fx.Node, grads: list[fx.Node]) -> _Narrow | None:
    """How to read bf16/fp16 x directly when `logits` is x upcast to fp32 (then reshaped) for this loss
    alone, as autocast does to cross_entropy: the kernels then read x, computing in fp32 as aten does,
    and write the gradient in x's dtype, as aten's cast of its fp32 gradient does, so neither the
    [N, V] fp32 copy nor its fp32 gradient exists. None where any other node needs them."""
    chain = _view_chain_above(logits, lp)
    if chain is None or not _is_cast(chain[1], torch.float32):
        return None
    views, node = chain
    x = node.args[0]
    x_val = x.meta.get("val")
    if (not isinstance(x_val, torch.Tensor) or x_val.dtype not in (torch.bfloat16, torch.float16)
            or x_val.device != logits.meta["val"].device):
        return None
    casts = []     # (views from the fp32 gradient, the cast of their result back to x's dtype)
    for user in (grads[1].users if grads else ()):
        below, cast = _view_chain_below(user)
        if not _is_cast(cast, x_val.dtype):
            return None
        casts.append((below, cast))
    if grads and not casts:
        return None
    return _Narrow(x, views, casts)


def _view_chain_above(node: fx.Node, reader: fx.Node) -> tuple[list[fx.Node], fx.Node] | None:
    """(the views, innermost first, from the first non-view above `node` down to `node`, and that
    non-view) where each is read only by the next and `node` only by `reader`; None otherwise."""
    views = []
    while node.target in _VIEWS and set(node.users) == {reader}:
        views.insert(0, node)
        reader, node = node, node.args[0]
    return (views, node) if set(node.users) == {reader} else None


class _Narrow(NamedTuple):
    x: fx.Node                                    # the narrow tensor the fp32 logits were cast from
    views: list[fx.Node]                          # reshapes of the fp32 cast, replayed on x
    casts: list[tuple[list[fx.Node], fx.Node]]    # gradient reshapes, and the cast back to x's dtype


def _replay(graph: fx.Graph, source: fx.Node, views: list[fx.Node], after: fx.Node) -> fx.Node:
    """`views` applied to `source` instead of their own input, inserted after `after`."""
    for view in views:
        with graph.inserting_after(after):
            after = graph.call_function(view.target, (source, *view.args[1:]), dict(view.kwargs))
        after.meta.update(view.meta)
        after.meta["val"] = compat.fake_call(aten.view.default, source.meta["val"], list(view.meta["val"].shape))   # symbolic sizes too
        source = after
    return source


