"""A planned kernel call for one input signature: which kernel, its grid and scalar arguments, and the
outputs to allocate. Planning (pointwise.plan, rowwise.plan) happens once per signature; `run` is the
per-call path and does no analysis."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from . import _triton
from .ir import Ref


@dataclass
class Launch:
    spec: Any                                   # PointwiseSpec or RowSpec: the kernel's cache key
    grid: tuple[int, ...]
    scalars: list[int]                          # in the order of the kernel's scalar parameters
    constexprs: dict[str, int]                  # block sizes
    num_warps: int
    allocs: list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]]   # stored outputs: shape, strides, dtype
    outputs: list[Ref]                          # returned: Ref("in", k) = input k, Ref("out", m) = stored m
    kernel: Callable | None = field(default=None)
    finish: Callable | None = field(default=None)   # the kernel's outputs -> the region's (colwise: partial sums)
    # After the first launch: the compiled kernel's direct launcher, and which inputs were 16-byte
    # aligned then (Triton specializes pointers on it; sizes and strides are fixed per Launch already).
    _direct: Callable | None = field(default=None, repr=False)
    _aligned: tuple[bool, ...] = field(default=(), repr=False)
    # Outputs returned as copies: a custom op's outputs may alias neither its inputs nor each other, but an
    # output can be an input itself (an op that lowers to nothing) or the value of an earlier output (two
    # ops the builder found equal: GPT-NeoX's two LayerNorms of one tensor share their mean and rstd).
    _copies: tuple[int, ...] = field(default=(), init=False, repr=False)

    def __post_init__(self) -> None:
        seen: set[Ref] = set()
        copies = []
        for i, r in enumerate(self.outputs):
            if r.kind == "in" or r in seen:
                copies.append(i)
            seen.add(r)
        self._copies = tuple(copies)

    def run(self, tensors) -> tuple[torch.Tensor, ...]:
        device = tensors[0].device
        outs = [torch.empty_strided(shape, stride, dtype=dtype, device=device) for shape, stride, dtype in self.allocs]
        if self.grid[0]:
            aligned = tuple(t.data_ptr() % 16 == 0 for t in tensors)
            if self._direct is not None and aligned == self._aligned:
                self._direct(*tensors, *outs, *self.scalars, *self.constexprs.values())
            else:
                compiled = self.kernel[self.grid](*tensors, *outs, *self.scalars, **self.constexprs,
                                                  num_warps=self.num_warps)
                self._direct, self._aligned = _triton.launcher(compiled, self.grid), aligned
        return self._returned(tensors, outs)

    def run_wrapped(self, tensors, wrap_triton: Callable) -> tuple[torch.Tensor, ...]:
        """`run` through torch's `wrap_triton` (inside a `torch.library.triton_op`): traceable, so
        Inductor launches the kernel from its generated wrapper, as it does its own."""
        device = tensors[0].device
        outs = [torch.empty_strided(shape, stride, dtype=dtype, device=device) for shape, stride, dtype in self.allocs]
        if self.grid[0]:
            wrap_triton(self.kernel)[self.grid](*tensors, *outs, *self.scalars, **self.constexprs,
                                                num_warps=self.num_warps)
        return self._returned(tensors, outs)

    def _returned(self, tensors, outs) -> tuple[torch.Tensor, ...]:
        if self.finish is not None:
            outs = self.finish(outs)
        result = [tensors[r.index] if r.kind == "in" else outs[r.index] for r in self.outputs]
        for i in self._copies:
            result[i] = result[i].clone()
        return tuple(result)


def returned(outputs: list[Ref], stored: list[tuple[Ref, Any]]) -> list[Ref]:
    """The region's outputs as references to inputs or to stored outputs (by position)."""
    position = {ref: m for m, (ref, _) in enumerate(stored)}
    return [r if r.kind == "in" else Ref("out", position[r]) for r in outputs]


def allocations(stored: list[tuple[Ref, Any]]) -> list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]]:
    return [(tuple(v.shape), tuple(v.stride()), v.dtype) for _, v in stored]
