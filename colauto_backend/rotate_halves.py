"""RoPE's rotate_half, `cat([-x[..., h:], x[..., :h]], -1)`, rewritten as ops a generated kernel can fuse.

A cat is not pointwise: its output's halves read different places of its inputs, so the generator
cannot take it, and every LLaMA layer ran four aten cats and four negs (forward q, k; backward q, k).
Rewritten, x is viewed as [..., 2, h] along the cat dim (splitting a dim is always a view), each half of
the result is a slice of that view (a view again) broadcast over the new dim, optionally negated, and
`where(first, half0, half1)` with a mask `first` = [[True], [False]] (computed in the graph) picks one per half. The result
is viewed back. Every op computes exactly what the cat did (negation and selection only), and neg and
where are pointwise, so they join the `x * cos + rotated * sin` kernel around them.

Matched: a two-piece cat whose pieces are each one half of the same tensor along the cat dim, or its
negation; halves come from `slice` or from `split`/`split_with_sizes` into two equal parts. Only x of
static shape (the views spell out its sizes; a symbolic size would need its graph node): with dynamic
shapes the cat stays an aten op.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .fusion_prep import call

aten = torch.ops.aten


def rewrite(gm: fx.GraphModule) -> int:
    """Rewrite every matching cat in `gm` (nodes need meta["val"]); returns how many were rewritten."""
    count = 0
    for cat in [n for n in gm.graph.nodes if n.target is aten.cat.default]:
        match = _match(cat)
        if match is not None:
            _replace(gm, cat, *match)
            count += 1
    if count:
        gm.recompile()
    return count


def _dim(dim: int, ndim: int) -> int:
    return dim + ndim if dim < 0 else dim


def _half(node) -> tuple[fx.Node, int, int] | None:
    """(x, dim, k) when `node` is half k (0: first, 1: second) of x along dim, else None."""
    if not isinstance(node, fx.Node):
        return None
    if node.target is aten.slice.Tensor:
        x, dim, start, end, step = (list(node.args) + [0, None, None, 1][len(node.args) - 1:])[:5]
        size = _static_size(x, dim)
        if size is None or size % 2 or step != 1:
            return None
        start = 0 if start is None else start + size if start < 0 else min(start, size)
        end = size if end is None else end + size if end < 0 else min(end, size)
        for k in (0, 1):
            if (start, end) == (k * size // 2, (k + 1) * size // 2):
                return x, _dim(dim, x.meta["val"].dim()), k
        return None
    if node.target is operator.getitem and isinstance(node.args[0], fx.Node):
        split, k = node.args
        if split.target is aten.split.Tensor:
            x, parts, dim = (list(split.args) + [0])[:3]
            parts = [parts, parts]
        elif split.target is aten.split_with_sizes.default:
            x, parts, dim = (list(split.args) + [0])[:3]
        else:
            return None
        size = _static_size(x, dim)
        if size is None or size % 2 or list(parts) != [size // 2, size // 2]:
            return None
        return x, _dim(dim, x.meta["val"].dim()), k
    return None


def _static_size(x, dim) -> int | None:
    val = x.meta.get("val") if isinstance(x, fx.Node) else None
    if not isinstance(val, torch.Tensor) or not isinstance(dim, int):
        return None
    size = val.shape[dim]
    return size if isinstance(size, int) else None


def _piece(node) -> tuple[fx.Node, int, int, bool] | None:
    """(x, dim, k, negated) for a half of x or its negation."""
    negated = isinstance(node, fx.Node) and node.target is aten.neg.default
    half = _half(node.args[0] if negated else node)
    return None if half is None else (*half, negated)


def _match(cat: fx.Node):
    tensors, dim = (list(cat.args) + [0])[:2]
    if len(tensors) != 2 or not isinstance(cat.meta.get("val"), torch.Tensor):
        return None
    pieces = [_piece(t) for t in tensors]
    if None in pieces:
        return None
    (x, xdim, _, _), (x1, xdim1, _, _) = pieces
    if x is not x1 or xdim != xdim1 or xdim != _dim(dim, cat.meta["val"].dim()):
        return None
    if not all(isinstance(n, int) for n in x.meta["val"].shape):     # the views below spell out x's shape
        return None
    return x, xdim, [(k, negated) for _, _, k, negated in pieces]


def _first_half_mask(graph: fx.Graph, val: torch.Tensor, trailing: int) -> fx.Node:
    """[[True], [False]] (shape [2] + [1] * trailing) on val's device, computed in the graph (arange < 1)
    rather than held as a constant: Inductor, which compiles what the generated kernels leave, cannot
    pass a constant tensor to a custom op."""
    with val.fake_mode:    # example values of ops with no tensor argument
        index = call(graph, aten.arange.default, 2, device=val.device)
        first = call(graph, aten.lt.Scalar, index, 1)
        return call(graph, aten.view.default, first, [2] + [1] * trailing)


def _replace(gm: fx.GraphModule, cat: fx.Node, x: fx.Node, dim: int, pieces) -> None:
    graph, val = gm.graph, x.meta["val"]
    shape = list(val.shape)
    with graph.inserting_before(cat):
        split = call(graph, aten.view.default, x, shape[:dim] + [2, shape[dim] // 2] + shape[dim + 1:])
        halves = [call(graph, aten.slice.Tensor, split, dim, k, k + 1) for k in (0, 1)]
        chosen = [call(graph, aten.neg.default, halves[k]) if negated else halves[k] for k, negated in pieces]
        first = _first_half_mask(graph, val, len(shape) - dim)
        picked = call(graph, aten.where.self, first, *chosen)
        out = call(graph, aten.view.default, picked, shape)
    cat.replace_all_uses_with(out)
    _erase_unused([cat])


def _erase_unused(nodes: list[fx.Node]) -> None:
    """Erase the cat and, transitively, the negs, getitems, splits and slices only it read."""
    erased: set[fx.Node] = set()
    while nodes:
        node = nodes.pop()
        if node.users or node in erased:
            continue
        inputs = node.all_input_nodes
        node.graph.erase_node(node)
        erased.add(node)
        nodes += [a for a in inputs if a.target in _VIEWS_AND_NEG]


_VIEWS_AND_NEG = (aten.neg.default, aten.slice.Tensor, aten.split.Tensor, aten.split_with_sizes.default,
                  operator.getitem)
