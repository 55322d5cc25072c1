"""How kernel operands are indexed: broadcast strides, iteration order, dim merging, index width.

A kernel walks an iteration space of `sizes` in row-major order; every operand reaches its element
through its own strides (0 along broadcast dims), so broadcast and non-contiguous inputs are read in
place. Dims are first ordered so that the first output is walked in memory order (stores coalesce),
then adjacent dims that every operand walks contiguously are merged, as TensorIterator does.
"""
from __future__ import annotations

import math

INDEX32_LIMIT = 2**31 - 2**20     # offsets past this use int64 (the margin covers a block past the end)


def broadcast_strides(shape, stride, to_shape) -> tuple[int, ...]:
    """Strides of a tensor broadcast to `to_shape`: 0 along dims it is broadcast in (or of size 1)."""
    lead = len(to_shape) - len(shape)
    return tuple(0 if d < lead or shape[d - lead] == 1 or n == 1 else stride[d - lead]
                 for d, n in enumerate(to_shape))


def iteration_dims(sizes, strides: list[tuple[int, ...]], order_by: int | None
                   ) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """(sizes, per-operand strides) with size-1 dims dropped, dims ordered by operand `order_by`'s
    strides (largest outermost; ties keep their order) and mergeable neighbours merged."""
    dims = [d for d, n in enumerate(sizes) if n != 1]
    if order_by is not None:
        dims.sort(key=lambda d: -strides[order_by][d])
    out_sizes: list[int] = []
    out_strides: list[list[int]] = [[] for _ in strides]
    for d in dims:
        if out_sizes and all(s[-1] == st[d] * sizes[d] for s, st in zip(out_strides, strides)):
            out_sizes[-1] *= sizes[d]
            for s, st in zip(out_strides, strides):
                s[-1] = st[d]
        else:
            out_sizes.append(sizes[d])
            for s, st in zip(out_strides, strides):
                s.append(st[d])
    return tuple(out_sizes), [tuple(s) for s in out_strides]


def pitches(sizes) -> tuple[int, ...]:
    """Elements per step of each dim in the row-major walk of `sizes`."""
    return tuple(math.prod(sizes[d + 1:]) for d in range(len(sizes)))


def is_walk_order(sizes, strides) -> bool:
    """The operand's elements are exactly the walk's flat index (no index arithmetic needed)."""
    return all(n == 1 or s == p for n, s, p in zip(sizes, strides, pitches(sizes)))


def needs_int64(sizes, strides: list[tuple[int, ...]]) -> bool:
    span = max([math.prod(sizes)] + [sum((n - 1) * s for n, s in zip(sizes, st)) + 1 for st in strides])
    return span >= INDEX32_LIMIT
