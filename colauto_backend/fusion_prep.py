"""Exact rewrites of a planned graph that let more of it fuse (COLAUTO_CODEGEN=triton, before fusion.fuse
forms regions), and the node predicates they share with it. Each rewrite computes what the graph
computed, bit for bit."""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

import triton_kernels

from .cost.flops import is_aliasing

aten = torch.ops.aten


def lowerable(node: fx.Node) -> bool:
    return (node.op == "call_function" and node.target in triton_kernels.RULES
            and isinstance(node.meta.get("val"), (torch.Tensor, tuple, list)))


def is_view(node: fx.Node) -> bool:
    """An op whose result aliases its one tensor input (view, transpose, detach, ...): it computes nothing."""
    return (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and is_aliasing(node.target) and len(node.all_input_nodes) == 1)


def computes(node: fx.Node) -> bool:
    """Not a getitem or a view: an op that writes memory when it runs as aten."""
    return node.target is not operator.getitem and not (
        isinstance(node.target, torch._ops.OpOverload) and is_aliasing(node.target))


def split_layer_norm_backwards(graph: fx.Graph) -> None:
    """native_layer_norm_backward(..., [True, w, b]) -> one node for the input gradient (fusible) and
    one with output_mask [False, w, b] for the weight and bias gradients; readers move to the one
    computing what they read."""
    nlnb = torch.ops.aten.native_layer_norm_backward.default
    for node in [n for n in graph.nodes if n.target is nlnb]:
        mask = list(node.args[7])
        if not mask[0] or not (mask[1] or mask[2]) or not isinstance(node.meta.get("val"), (tuple, list)):
            continue
        val = node.meta["val"]
        with graph.inserting_before(node):
            grad_input = graph.call_function(nlnb, (*node.args[:7], [True, False, False]), dict(node.kwargs))
            columns = graph.call_function(nlnb, (*node.args[:7], [False, *mask[1:]]), dict(node.kwargs))
        for new, keep in ((grad_input, (0,)), (columns, (1, 2))):
            new.meta.update(node.meta)
            new.meta["val"] = tuple(v if i in keep else None for i, v in enumerate(val))
        for user in list(node.users):
            if user.target is not operator.getitem:    # only getitems read a tuple; leave anything else whole
                break
        else:
            for user in list(node.users):
                user.replace_input_with(node, grad_input if user.args[1] == 0 else columns)
            graph.erase_node(node)
            continue
        graph.erase_node(grad_input)
        graph.erase_node(columns)


def merge_duplicate_casts(graph: fx.Graph) -> None:
    """Identical casts of one tensor -> one (autocast casts a linear layer's input once per layer: q, k
    and v of one normalized tensor were three bf16 copies), so the cast can join its producer's kernel."""
    first: dict[tuple, fx.Node] = {}
    for node in [n for n in graph.nodes if n.target is torch.ops.aten._to_copy.default]:
        key = (node.args, tuple(sorted(node.kwargs.items())))
        if key in first:
            node.replace_all_uses_with(first[key])
            graph.erase_node(node)
        else:
            first[key] = node


def copy_shared_casts(graph: fx.Graph) -> None:
    """A dtype cast read by several fusible ops -> one copy per reader, so each reader's kernel casts in
    registers instead of reading a cast materialized by aten (in a bf16 backward: every LayerNorm's
    incoming gradient, read by the input-gradient rows and the weight-gradient columns). Copies that no
    kernel takes are merged again after fusion (`merge_duplicate_casts`)."""
    for node in [n for n in graph.nodes if n.target is torch.ops.aten._to_copy.default]:
        readers = list(node.users)   # (views lead to matmuls: one cast, in its producer's kernel, serves them)
        if len(readers) < 2 or not all(lowerable(r) and computes(r) for r in readers):
            continue
        for reader in readers[1:]:
            with graph.inserting_before(reader):
                copy = graph.node_copy(node)
            copy.meta.update(node.meta)
            reader.replace_input_with(node, copy)


def fold_expands(graph: fx.Graph) -> None:
    """An expand read by pointwise ops disappears into their broadcasting: a unary op (scalars aside) of
    an expand becomes the op of the expanded value, expanded; an expand beside a full-size operand is
    dropped. The mean's backward in RMSNorm, expand(per-row sum) / C * x, is then a per-row division
    broadcast in a multiply, all inside the row kernel; the expand, stored as a region output while the
    region grew, kept the norm's backward in two kernels."""
    changed = True
    while changed:
        changed = False
        for expand in [n for n in graph.nodes if n.target is aten.expand.default]:
            for user in list(expand.users):
                changed |= _fold_into(graph, expand, user)
            if not expand.users:
                graph.erase_node(expand)


def _fold_into(graph: fx.Graph, expand: fx.Node, user: fx.Node) -> bool:
    if not _pointwise(user) or user.target is aten.clone.default:
        return False
    source = expand.args[0]
    others = [a for a in user.all_input_nodes if a is not expand]
    if not all(isinstance(a.meta.get("val"), torch.Tensor) for a in [source, *others]):
        return False
    args, kwargs = fx.map_arg((user.args, user.kwargs), lambda a: source if a is expand else a)
    val = user.target(*fx.map_arg(args, _val), **fx.map_arg(kwargs, _val))
    if others:          # the op broadcasts the source itself: same result, same layout, or leave it
        if val.shape != user.meta["val"].shape or val.stride() != user.meta["val"].stride():
            return False
        user.replace_input_with(expand, source)
        return True
    # a unary op: compute it on the source, expand after; its readers must not care about layout
    if not all(_pointwise(r) for r in user.users):
        return False
    with graph.inserting_before(user):
        inner = graph.call_function(user.target, args, kwargs)
        inner.meta["val"] = val
        # (the sizes may be nodes: a dynamic shape's sym_size; `call` reads their example values)
        outer = call(graph, aten.expand.default, inner, *expand.args[1:], **expand.kwargs)
    user.replace_all_uses_with(outer)
    graph.erase_node(user)
    return True


def _pointwise(node: fx.Node) -> bool:
    return (isinstance(node.target, torch._ops.OpOverload) and torch.Tag.pointwise in node.target.tags
            and isinstance(node.meta.get("val"), torch.Tensor))


def _val(node: fx.Node):
    return node.meta["val"]


SMALL_SUM = 8       # a sum over a middle dim this short becomes adds (grouped-query attention: heads / kv heads)


def unroll_small_sums(graph: fx.Graph) -> None:
    """sum(x, [d]) over a short middle dim -> x[:, .., 0] + x[:, .., 1] + ...: selects are views, adds are
    pointwise, so the sum joins the kernels around it (the generator reduces only the last dim). In
    grouped-query attention's backward, the key and value gradients are such sums over the query heads
    sharing a kv head (in fp32: a cast before, or autocast's dtype=float32): the cast moves onto the
    selects, into the same kernel. As aten's sum: half values are added in fp32 and rounded once."""
    for node in [n for n in graph.nodes if n.target is aten.sum.dim_IntList]:
        match = _small_middle_sum(node)
        if match is None:
            continue
        x, dim, keepdim, out_dtype = match
        acc = torch.float32 if out_dtype in (torch.float16, torch.bfloat16) else out_dtype
        source, cast = _through_cast(x)
        if cast != acc:
            source = x
        with graph.inserting_before(node):
            terms = []
            for i in range(x.meta["val"].shape[dim]):
                term = call(graph, aten.select.int, source, dim, i)
                if term.meta["val"].dtype != acc:
                    term = call(graph, aten._to_copy.default, term, dtype=acc)
                terms.append(term)
            total = terms[0]
            for term in terms[1:]:
                total = call(graph, aten.add.Tensor, total, term)
            if acc != out_dtype:
                total = call(graph, aten._to_copy.default, total, dtype=out_dtype)
            if keepdim:
                total = call(graph, aten.unsqueeze.default, total, dim)
        node.replace_all_uses_with(total)
        graph.erase_node(node)
        for dead in (x, x.args[0] if x.target is aten.view.default else None):
            if isinstance(dead, fx.Node) and not dead.users:
                graph.erase_node(dead)


def _small_middle_sum(node: fx.Node):
    """(x, dim, keepdim, result dtype) for sum(x, [dim], keepdim[, dtype]) over a short dim that is not
    the last one."""
    x, dims = node.args[:2]
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    val = x.meta.get("val") if isinstance(x, fx.Node) else None
    out = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not val.is_floating_point() or not isinstance(out, torch.Tensor):
        return None
    if not isinstance(dims, (list, tuple)) or len(dims) != 1 or not isinstance(dims[0], int):
        return None
    dim = dims[0] % val.dim()
    size = val.shape[dim]
    if dim == val.dim() - 1 or not isinstance(size, int) or not 2 <= size <= SMALL_SUM:
        return None
    return x, dim, keepdim, out.dtype


def _through_cast(x: fx.Node) -> tuple[fx.Node, torch.dtype | None]:
    """(tensor to select from, dtype to cast each select to): x itself, or for x = [view of] a cast read
    only here, the same view of the cast's input and the cast's dtype."""
    cast = x.args[0] if x.target is aten.view.default else x
    if (cast.target is not aten._to_copy.default or len(cast.users) != 1 or len(x.users) != 1
            or set(cast.kwargs) - {"dtype", "layout", "device"} or cast.kwargs.get("dtype") is None):
        return x, None
    src = cast.args[0]
    if x is cast:
        return src, cast.kwargs["dtype"]
    try:        # the view must hold for the cast's input as it did for the cast's output
        view = aten.view.default(src.meta["val"], x.args[1])
    except RuntimeError:
        return x, None
    if view.stride() != x.meta["val"].stride():
        return x, None
    with x.graph.inserting_before(x):
        return call(x.graph, aten.view.default, src, x.args[1]), cast.kwargs["dtype"]


def call(graph: fx.Graph, target, *args, **kwargs) -> fx.Node:
    """A new call of `target` at the graph's insertion point, its example value computed from its
    arguments' (fake tensors compute under their own fake mode)."""
    node = graph.call_function(target, args, kwargs)
    node.meta["val"] = target(*fx.map_arg(args, _val), **fx.map_arg(kwargs, _val))
    return node
