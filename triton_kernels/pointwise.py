"""Pointwise regions: one kernel over the flat index of the outputs' shape.

Each program handles BLOCK consecutive elements of the walk (see layout); an operand walked in the
same order is read at the flat index, any other (broadcast, transposed, sliced) through per-dim
indices times its strides, which arrive as arguments. Sizes and strides are arguments too, so one
kernel serves every size with the same broadcast pattern.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import layout
from .ir import Instr, NotFusible, Ref
from .launch import Launch, returned
from .region import Region
from .triton_expr import dim_indices, expression, in_compute_dtype, name, pointers, store_value
from .tuning import Tuning


@dataclass(frozen=True)
class Access:
    dtype: torch.dtype
    dims: tuple[bool, ...] | None      # None: read at the flat index; else the dims with a nonzero stride


@dataclass(frozen=True)
class PointwiseSpec:
    instrs: tuple[Instr, ...]
    inputs: tuple[Access, ...]
    outputs: tuple[tuple[Ref, Access], ...]
    ndim: int
    int64: bool


def _used_dims(spec: PointwiseSpec) -> list[int]:
    return [d for d in range(spec.ndim) if any(a.dims and a.dims[d] for _, a in pointers(spec))]


def scalar_params(spec: PointwiseSpec) -> list[str]:
    dims = _used_dims(spec)
    params = ["numel"]
    params += [f"size{d}" for d in dims if d > 0]
    params += [f"pitch{d}" for d in dims if d < spec.ndim - 1]
    for p, a in pointers(spec):
        params += [f"{p}_s{d}" for d in range(spec.ndim) if a.dims and a.dims[d]]
    return params


def _offset(p: str, a: Access) -> str | None:
    if a.dims is None:
        return "i"
    return " + ".join(f"i{d} * {p}_s{d}" for d, used in enumerate(a.dims) if used) or None


def emit(spec: PointwiseSpec) -> str:
    params = [p for p, _ in pointers(spec)] + scalar_params(spec)
    lines = ["@triton.jit", f"def kernel({', '.join(params)}, BLOCK: tl.constexpr):"]
    pid = "tl.program_id(0).to(tl.int64)" if spec.int64 else "tl.program_id(0)"
    body = [f"i = {pid} * BLOCK + tl.arange(0, BLOCK)", "mask = i < numel"]
    body += dim_indices("i", "i", _used_dims(spec), spec.ndim)
    used = {a for ins in spec.instrs for a in ins.args if isinstance(a, Ref)}
    for k, a in enumerate(spec.inputs):
        if Ref("in", k) not in used:
            continue
        off = _offset(f"in{k}", a)
        load = f"tl.load(in{k} + {off}, mask=mask)" if off else f"tl.load(in{k})"   # no offset: a 0-dim input
        body.append(f"x{k} = {in_compute_dtype(load, a.dtype)}")

    def dtype_of(r: Ref) -> torch.dtype:
        return spec.inputs[r.index].dtype if r.kind == "in" else spec.instrs[r.index].dtype
    for j, ins in enumerate(spec.instrs):
        body.append(f"{name(Ref('t', j))} = {expression(ins, dtype_of)}")
    for m, (ref, a) in enumerate(spec.outputs):
        body.append(f"tl.store(out{m} + {_offset(f'out{m}', a)}, {store_value(ref, dtype_of, a.dtype)}, mask=mask)")
    return "\n".join(lines + ["    " + line for line in body]) + "\n"


def plan(region: Region, tuning: Tuning) -> Launch:
    shapes = {tuple(v.shape) for _, v in region.stored}
    if len(shapes) > 1:
        raise NotFusible(f"pointwise outputs of shapes {sorted(shapes)} are not fusible into one kernel")
    shape = shapes.pop() if shapes else ()
    strides = [layout.broadcast_strides(t.shape, t.stride(), shape) for t in region.inputs]
    strides += [tuple(v.stride()) for _, v in region.stored]
    sizes, strides = layout.iteration_dims(shape, strides, order_by=len(region.inputs) if region.stored else None)

    def access(dtype, st) -> Access:
        return Access(dtype, None if layout.is_walk_order(sizes, st) else tuple(s != 0 for s in st))
    n_in = len(region.inputs)
    spec = PointwiseSpec(
        instrs=tuple(region.instrs),
        inputs=tuple(access(t.dtype, st) for t, st in zip(region.inputs, strides)),
        outputs=tuple((ref, access(v.dtype, st)) for (ref, v), st in zip(region.stored, strides[n_in:])),
        ndim=len(sizes), int64=layout.needs_int64(sizes, strides))
    numel = math.prod(sizes)
    values = {"numel": numel}
    values |= {f"size{d}": n for d, n in enumerate(sizes)}
    values |= {f"pitch{d}": p for d, p in enumerate(layout.pitches(sizes))}
    for (p, _), st in zip(pointers(spec), strides):
        values |= {f"{p}_s{d}": s for d, s in enumerate(st)}
    grid = (-(-numel // tuning.block) if region.stored else 0,)
    return Launch(spec, grid, [values[p] for p in scalar_params(spec)], {"BLOCK": tuning.block},
                  tuning.pointwise_warps, region.allocs, returned(region.outputs, region.stored))
