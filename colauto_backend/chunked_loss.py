"""The loss's gradient computed in the forward, a block of rows at a time (COLAUTO_CHUNKED_LOSS=on).

A language model's loss is `nll_loss(log_softmax(h @ W.T))` over N tokens and a vocabulary of V: its
backward starts from an [N, V] gradient of the logits (`nll_loss_backward`, `_log_softmax_backward_data`,
the cast back to the logits' dtype) that only two matrix products read: `G @ W` (the gradient of the
head's input) and `G.T @ h` (of its weight). So the backward keeps an [N, V] tensor from the forward (the
log-probabilities or logits) and at its start makes another: for GPT-2 at 16 x 1024 tokens, 3 GiB each
in fp32, most of the activation memory at the step's peak.

Both products are linear in G, and G is the loss's scalar gradient (the backward's `tangent`) times a
G1 the forward can compute: softmax(x) less one at the target, zero on an ignored row, over the total
weight (mean). `rewrite` moves that work into the forward, CHUNKS blocks of rows at a time, each block
read from the logits before their upcast (one logsumexp reduction, the rest elementwise); the forward
keeps the [N, h] product (the blocks concatenated) and the [V, h] one (the blocks summed, in fp32), and
the backward multiplies them by the tangent. No [N, V] tensor is kept for the backward, nor made in it.
The loss itself is computed as traced. The products are the same work; the results differ from the
traced step's by rounding (the weight's gradient a sum of CHUNKS products in fp32; the tangent applied
after the cast instead of before, exact for 1.0 and powers of two).

Applied where the graph has exactly this form (a 2-D log-softmax over the last dimension of static
sizes, nll_loss without class weights, mean or sum, its gradient read only through reshapes, one cast
and an unused output's zero gradient by those two products); a graph of another form is left as it is.
Off by default: measured on one H100 it saved memory but no time (bench/results/h100-2026-12-07-chunked-loss).
"""
from __future__ import annotations

import operator
from typing import NamedTuple

import torch
import torch.fx as fx

from . import _torch_compat as compat
from . import counters, output_grads
from .graph import is_backward

aten = torch.ops.aten
CHUNKS = 8
# the loss's ops `rewrite` matches: under Inductor traced whole and decomposed after it (backend); the
# blocks it adds are made of ops Inductor lowers as they are
KEPT = (aten._log_softmax.default, aten._log_softmax_backward_data.default, aten.nll_loss_forward.default,
        aten.nll_loss_backward.default)
# ... and the composite ops above them that Inductor's table would decompose past them, also kept whole at
# the trace (their own composite kernels then run, calling the ops above)
COMPOSITES = (aten.cross_entropy_loss.default, aten.log_softmax.int, aten.nll_loss.default, aten.nll_loss_nd.default)
CAST = torch.ops.prims.convert_element_type.default    # the casts it makes: what Inductor's table leaves
VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
REWRITTEN = counters.counter("losses whose gradient is computed in the forward, in blocks of rows")


def rewrite(joint: fx.GraphModule) -> int:
    """Rewrite every matching loss of `joint` in place; the number rewritten."""
    done = 0
    for lp in [n for n in joint.graph.nodes if n.target is aten._log_softmax.default]:
        found = _match(lp)
        if found is not None:
            _rewrite(joint.graph, found)
            done += 1
    if done:
        joint.graph.eliminate_dead_code()
        joint.graph.lint()
        joint.recompile()
        REWRITTEN["rewritten"] += done
    return done


class _Match(NamedTuple):
    lp: fx.Node          # _log_softmax(logits [N, V])
    nll: fx.Node         # nll_loss_forward(lp, target, None, reduction, ignore_index)
    tangent: fx.Node     # the loss's gradient (nll_loss_backward's grad_output), a backward value
    dtype: torch.dtype   # the gradient's dtype where the two products read it (a cast back, or fp32)
    rows_of: list[fx.Node]    # users G @ X: the product, X a forward value      -> rows, concatenated
    cols_of: list[fx.Node]    # users t(G) @ Y: the product, Y a forward value   -> summed over row blocks


def is_cast(node: fx.Node, dtype: torch.dtype | None = None) -> bool:
    """aten's cast (`_to_copy` to a dtype alone), or the prim Inductor's table turns it into."""
    if node.target is torch.ops.prims.convert_element_type.default:
        return dtype is None or node.args[1] == dtype
    return (node.target is aten._to_copy.default and set(node.kwargs) <= {"dtype", "layout", "device"}
            and "dtype" in node.kwargs and (dtype is None or node.kwargs["dtype"] == dtype))


def items(nll: fx.Node) -> tuple[fx.Node | None, fx.Node | None]:
    """nll_loss_forward's (loss, total_weight) getitem nodes, None where unused."""
    got = {u.args[1]: u for u in nll.users if u.target is operator.getitem}
    return got.get(0), got.get(1)


def view_chain_below(node: fx.Node) -> tuple[list[fx.Node], fx.Node]:
    """(the single-reader views starting at `node`, in order, and the node they lead to)."""
    views = []
    while node.target in VIEWS and len(node.users) == 1:
        views.append(node)
        node = next(iter(node.users))
    return views, node


_DETACH = (aten.detach.default, aten.alias.default)     # how aten's trace and Inductor's table read lp


def _transposes(node: fx.Node) -> bool:
    """A 2-D transpose: aten's t, or the permute Inductor's table makes of it."""
    return node.target is aten.t.default or (node.target is aten.permute.default and list(node.args[1]) == [1, 0])


def _static_2d(node: fx.Node) -> tuple[int, int] | None:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dim() != 2:
        return None
    if not all(isinstance(s, int) for s in val.shape):
        return None
    return int(val.shape[0]), int(val.shape[1])


def _match(lp: fx.Node) -> _Match | None:
    logits, dim = lp.args[0], lp.args[1]
    shape = _static_2d(logits)
    if shape is None or dim not in (1, -1) or lp.args[2] is not False:
        return None
    readers = [u for u in lp.users if u.target not in _DETACH]
    detached = [u for u in lp.users if u.target in _DETACH]
    fwd = [u for u in readers if u.target is aten.nll_loss_forward.default]
    bwd = [u for u in readers if u.target is aten.nll_loss_backward.default]
    lsm_bwd = [u for u in readers if u.target is aten._log_softmax_backward_data.default]
    if len(fwd) != 1 or len(bwd) != 1 or len(readers) != len(fwd) + len(bwd) + len(lsm_bwd):
        return None
    nll, nll_bwd = fwd[0], bwd[0]
    _, target, weight, reduction, ignore = nll.args
    tval = target.meta.get("val")
    if weight is not None or reduction not in (1, 2) or not isinstance(tval, torch.Tensor) or tuple(tval.shape) != shape[:1]:
        return None
    if nll_bwd.args[1:6] != (lp, target, None, reduction, ignore) or nll_bwd.args[6] is not items(nll)[1]:
        return None
    users = list(nll_bwd.users)
    if len(users) != 1 or users[0].target is not aten._log_softmax_backward_data.default:
        return None
    grad = users[0]
    # its `output` is lp itself or lp through detaches (aten's trace)
    out = grad.args[1]
    while out.target in _DETACH:
        out = out.args[0]
    if out is not lp or any(u is not grad and u not in detached for u in lsm_bwd):
        return None
    # where the products read it: through reshapes and at most one cast back to the logits' dtype
    g = _products_input(grad)
    if _static_2d(g) != shape:
        return None
    rows_of, cols_of = [], []
    for u in g.users:
        if u.target is aten.mm.default and u.args[0] is g and _movable(u.args[1]):
            rows_of.append(u)
        elif (_transposes(u) and len(u.users) == 1
              and (mm := next(iter(u.users))).target is aten.mm.default and mm.args[0] is u
              and _movable(mm.args[1])):
            cols_of.append(mm)
        else:
            return None
    if not rows_of and not cols_of:
        return None
    dtype = g.meta["val"].dtype
    return _Match(lp, nll, nll_bwd.args[0], dtype, rows_of, cols_of)


def _products_input(grad: fx.Node) -> fx.Node:
    """The [N, V] node the products read: `grad` through reshapes, at most one cast and the addition of
    an output's gradient that the step does not take (output_grads: the logits beside the loss; zeros),
    each read once; the last node of that chain (its readers are the products)."""
    node, casts = grad, 0
    while len(node.users) == 1:
        user = next(iter(node.users))
        if user.target in VIEWS or (is_cast(user) and casts == 0) or _adds_unused(user, node):
            casts += is_cast(user)
            node = user
            continue
        break
    return node


def _adds_unused(user: fx.Node, node: fx.Node) -> bool:
    if user.target is not aten.add.Tensor or len(user.args) != 2 or user.kwargs:
        return False
    other = user.args[1] if user.args[0] is node else user.args[0]
    return isinstance(other, fx.Node) and other.op == "placeholder" and bool(other.meta.get(output_grads.UNUSED))


# ops the backward applies to a forward value that the forward can apply itself (AOT traces mm's
# backward `G @ W.T.T` as a backward `t` of the forward's `W.T`)
_LAYOUT = (aten.t.default, aten.view.default, aten.permute.default, aten.transpose.int)


def _movable(node: fx.Node) -> bool:
    """Whether the forward can compute `node`: a forward value, or layout ops of one."""
    while is_backward(node):
        if node.target not in _LAYOUT or not isinstance(node.args[0], fx.Node):
            return False
        node = node.args[0]
    return not (node.op == "placeholder" and node.name.startswith("tangents"))


def _before_upcast(logits: fx.Node) -> fx.Node | None:
    """The bf16/fp16 tensor `logits` is an fp32 copy of, through reshapes; None where it is not one."""
    node = logits
    while node.target in VIEWS:
        node = node.args[0]
    if not is_cast(node, torch.float32):
        return None
    src = node.args[0]
    val = src.meta.get("val")
    ok = isinstance(val, torch.Tensor) and val.dtype in (torch.bfloat16, torch.float16)
    return src if ok and val.numel() == logits.meta["val"].numel() else None


def _rewrite(graph: fx.Graph, m: _Match) -> None:
    lp, nll = m.lp, m.nll
    logits = lp.args[0]
    n_rows, vocab = (int(d) for d in logits.meta["val"].shape)
    _, target, _, reduction, ignore = nll.args
    fwd_meta = {k: v for k, v in nll.meta.items() if k != "val"}
    # the blocks go before the loss, after what they read (the logits, the targets)
    order = {n: i for i, n in enumerate(graph.nodes)}
    anchor = [max((lp.prev, target), key=order.__getitem__)]

    def add(op, *args, **kwargs) -> fx.Node:
        vals = fx.node.map_arg(args, lambda a: a.meta["val"])
        with graph.inserting_after(anchor[0]):
            node = graph.call_function(op, tuple(args), kwargs)
        node.meta.update(fwd_meta)
        node.meta["val"] = compat.fake_call(lambda *v: op(*v, **kwargs), *vals)
        anchor[0] = node
        return node

    def forward_copy(node: fx.Node) -> fx.Node:     # `node` (_movable) computed in the forward
        if not is_backward(node):
            return node
        return add(node.target, forward_copy(node.args[0]), *node.args[1:], **node.kwargs)

    # nll_loss's total weight without class weights: the targets that are not ignored
    total = add(CAST, add(aten.sum.default, add(aten.ne.Scalar, target, ignore)), lp.meta["val"].dtype)
    rows_by = [forward_copy(mm.args[1]) for mm in m.rows_of]
    cols_by = [forward_copy(mm.args[1]) for mm in m.cols_of]
    step = -(-n_rows // min(CHUNKS, n_rows))
    rows_parts: list[list[fx.Node]] = [[] for _ in m.rows_of]
    cols_sums: list[fx.Node | None] = [None for _ in m.cols_of]
    # the blocks read the logits before their upcast (autocast's bf16 copy), cast in the block: the whole
    # fp32 copy is not made for them
    narrow = _before_upcast(logits)
    rows_of_logits = logits if narrow is None else add(aten.view.default, narrow, [n_rows, vocab])
    columns = add(torch.ops.prims.iota.default, vocab, start=0, step=1, dtype=torch.int64,
                  device=logits.meta["val"].device, requires_grad=False)
    for start in range(0, n_rows, step):
        end = min(start + step, n_rows)
        x = add(aten.slice.Tensor, rows_of_logits, 0, start, end)
        if narrow is not None:
            x = add(CAST, x, torch.float32)
        y = add(aten.unsqueeze.default, add(aten.slice.Tensor, target, 0, start, end), 1)
        # the gradient of nll_loss(log_softmax(x)) at its target: softmax(x) less 1 at the target, 0 on an
        # ignored row, over the total weight (mean); one reduction (the row's logsumexp), the rest
        # elementwise: a kernel or two per block under Inductor, no [rows, V] fp32 tensor kept between
        peak = add(aten.amax.default, x, [1], True)
        shifted = add(aten.sub.Tensor, x, peak)
        lse = add(aten.log.default, add(aten.sum.dim_IntList, add(aten.exp.default, shifted), [1], True))
        prob = add(aten.exp.default, add(aten.sub.Tensor, shifted, lse))
        g = add(aten.where.self, add(aten.eq.Tensor, columns, y), add(aten.sub.Tensor, prob, 1), prob)
        weight = add(CAST, add(aten.ne.Scalar, y, ignore), torch.float32)
        if reduction == 1:
            weight = add(aten.div.Tensor, weight, total)
        g = add(aten.mul.Tensor, g, weight)
        if m.dtype != torch.float32:
            g = add(CAST, g, m.dtype)
        for parts, by in zip(rows_parts, rows_by):
            parts.append(add(aten.mm.default, g, by))
        for i, by in enumerate(cols_by):
            part = add(aten.mm.default, add(aten.permute.default, g, [1, 0]), add(aten.slice.Tensor, by, 0, start, end))
            if part.meta["val"].dtype != torch.float32:
                part = add(CAST, part, torch.float32)
            cols_sums[i] = part if cols_sums[i] is None else add(aten.add.Tensor, cols_sums[i], part)
    saved = [add(aten.cat.default, parts, 0) if len(parts) > 1 else parts[0] for parts in rows_parts]

    # the backward: each product is the tangent times what the forward computed
    for mm, value in [*zip(m.rows_of, saved), *zip(m.cols_of, cols_sums)]:
        with graph.inserting_before(mm):
            scaled = graph.call_function(aten.mul.Tensor, (value, m.tangent))
            scaled.meta.update({k: v for k, v in mm.meta.items() if k != "val"})
            scaled.meta["val"] = compat.fake_call(aten.mul.Tensor, value.meta["val"], m.tangent.meta["val"])
            out = scaled
            if scaled.meta["val"].dtype != mm.meta["val"].dtype:
                out = graph.call_function(CAST, (scaled, mm.meta["val"].dtype))
                out.meta.update(scaled.meta)
                out.meta["val"] = compat.fake_call(CAST, scaled.meta["val"], mm.meta["val"].dtype)
        mm.replace_all_uses_with(out)
