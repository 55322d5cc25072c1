"""Column regions: pointwise ops over [rows, cols] whose outputs are sums over the rows (bias gradients,
LayerNorm's weight and bias gradients).

A sum over rows has too little parallelism for one program per column block, so the rows are split:
program (c, s) walks rows [s * rows_per_split, (s + 1) * rows_per_split) of columns block c in
XBLOCK x RBLOCK tiles (loads coalesce along the columns), accumulates in fp32 registers and writes one
partial row per split. The partials ([splits, cols], fp32) are then summed over the splits by aten
(deterministic, unlike atomics) and rounded to the output's dtype: eager's single rounding of an fp32
accumulation, in a different summation order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import layout
from .ir import COLUMN_SUM, Instr, NotFusible, Ref
from .launch import Launch, returned
from .region import Region
from .triton_expr import dim_indices, expression, in_compute_dtype
from .tuning import Tuning, next_pow2


@dataclass(frozen=True)
class ColumnAccess:
    dtype: torch.dtype
    outer: tuple[bool, ...]         # the outer (row) dims with a nonzero stride
    scalar: bool                    # a 0-dim input: one element for the whole region


@dataclass(frozen=True)
class ColumnSpec:
    instrs: tuple[Instr, ...]
    inputs: tuple[ColumnAccess, ...]
    sums: tuple[int, ...]           # the instructions whose column sums are stored, one partial each
    outer_ndim: int
    int64: bool


def _used_dims(spec: ColumnSpec) -> list[int]:
    return [d for d in range(spec.outer_ndim) if any(a.outer[d] for a in spec.inputs)]


def scalar_params(spec: ColumnSpec) -> list[str]:
    dims = _used_dims(spec)
    params = ["n_rows", "n_cols", "rows_per_split"] + [f"size{d}" for d in dims if d > 0]
    params += [f"pitch{d}" for d in dims if d < spec.outer_ndim - 1]
    for k, a in enumerate(spec.inputs):
        if not a.scalar:
            params += [f"in{k}_o{d}" for d in range(spec.outer_ndim) if a.outer[d]] + [f"in{k}_sc"]
    return params


def emit(spec: ColumnSpec) -> str:
    def dtype_of(r: Ref) -> torch.dtype:
        return spec.inputs[r.index].dtype if r.kind == "in" else spec.instrs[r.index].dtype
    pid = ".to(tl.int64)" if spec.int64 else ""
    body = [f"cols = (tl.program_id(0){pid} * RBLOCK + tl.arange(0, RBLOCK))[None, :]",
            "col_mask = cols < n_cols",
            f"first = tl.program_id(1){pid} * rows_per_split"]
    body += [f"acc{j} = tl.zeros([XBLOCK, RBLOCK], tl.float32)" for j in spec.sums]
    loop = ["rows = start + tl.arange(0, XBLOCK)[:, None]", "mask = (rows < n_rows) & col_mask"]
    loop += dim_indices("rows", "r", _used_dims(spec), spec.outer_ndim)
    used = {a for ins in spec.instrs for a in ins.args if isinstance(a, Ref)}
    for k, a in enumerate(spec.inputs):
        if Ref("in", k) not in used:
            continue
        if a.scalar:
            load = f"tl.load(in{k})"
        else:
            terms = [f"r{d} * in{k}_o{d}" for d in range(spec.outer_ndim) if a.outer[d]] + [f"cols * in{k}_sc"]
            load = f"tl.load(in{k} + {' + '.join(terms)}, mask=mask, other=0)"
        loop.append(f"x{k} = {in_compute_dtype(load, a.dtype)}")
    for j, ins in enumerate(spec.instrs):
        if ins.op == COLUMN_SUM:
            arg = ins.args[0]
            value = f"x{arg.index}" if arg.kind == "in" else f"t{arg.index}"
            loop.append(f"acc{j} += tl.where(mask, {value}, 0).to(tl.float32)")
        else:
            loop.append(f"t{j} = {expression(ins, dtype_of)}")
    body.append("for start in range(first, first + rows_per_split, XBLOCK):")   # (r0, r1.. index dims)
    body += ["    " + line for line in loop]
    for m, j in enumerate(spec.sums):
        body.append(f"tl.store(part{m} + tl.program_id(1){pid} * n_cols + cols, "
                    f"tl.sum(acc{j}, 0)[None, :], mask=col_mask)")
    params = ([f"in{k}" for k in range(len(spec.inputs))] + [f"part{m}" for m in range(len(spec.sums))]
              + scalar_params(spec) + ["XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr"])
    return f"@triton.jit\ndef kernel({', '.join(params)}):\n" + "\n".join("    " + line for line in body) + "\n"


def plan(region: Region, tuning: Tuning) -> Launch:
    sums = {Ref("t", j) for j, ins in enumerate(region.instrs) if ins.op == COLUMN_SUM}
    if any(a in sums for ins in region.instrs for a in ins.args):
        raise NotFusible("a value computed from a column sum is not fusible into the sum's kernel")
    stored = [ref for ref, _ in region.stored]
    if not stored or any(ref.kind != "t" or region.instrs[ref.index].op != COLUMN_SUM for ref in stored):
        raise NotFusible("a region that stores anything but column sums is not fusible with them")
    rows = tuple(torch.broadcast_shapes(*(s for r, s in region.shapes.items() if r not in sums)))
    outer_shape, n_cols = rows[:-1], rows[-1]
    if not math.prod(rows):
        raise NotFusible(f"column sums over an empty tensor of shape {list(rows)} are not fusible")
    for ref, v in region.stored:
        if tuple(v.shape) not in ((n_cols,), (1,) * len(outer_shape) + (n_cols,)):
            raise NotFusible(f"a column sum of shape {tuple(v.shape)} is not fusible with rows of shape {rows}")
    full = [layout.broadcast_strides(t.shape, t.stride(), rows) for t in region.inputs]
    sizes, outer = layout.iteration_dims(outer_shape, [st[:-1] for st in full], order_by=None)
    accesses = tuple(ColumnAccess(t.dtype, tuple(s != 0 for s in st), t.dim() == 0)
                     for t, st in zip(region.inputs, outer))
    spec = ColumnSpec(instrs=tuple(region.instrs), inputs=accesses, sums=tuple(ref.index for ref in stored),
                      outer_ndim=len(sizes), int64=layout.needs_int64(rows, full))
    n_rows = math.prod(outer_shape)
    rblock = min(next_pow2(n_cols), tuning.column_block)
    xblock = min(next_pow2(n_rows), tuning.column_rows)
    col_blocks = -(-n_cols // rblock)
    splits = max(1, min(-(-n_rows // xblock), tuning.column_programs // col_blocks))
    rows_per_split = -(-(-(-n_rows // splits)) // xblock) * xblock       # a multiple of XBLOCK: no overlap
    splits = -(-n_rows // rows_per_split)
    values = {"n_rows": n_rows, "n_cols": n_cols, "rows_per_split": rows_per_split}
    values |= {f"size{d}": n for d, n in enumerate(sizes)}
    values |= {f"pitch{d}": p for d, p in enumerate(layout.pitches(sizes))}
    for k, (st, st_full) in enumerate(zip(outer, full)):
        values |= {f"in{k}_o{d}": s for d, s in enumerate(st)} | {f"in{k}_sc": st_full[-1]}
    finals = [(shape, dtype) for shape, _, dtype in region.allocs]     # eager's shapes (views: S-rank stored)

    def finish(partials: list[torch.Tensor]) -> list[torch.Tensor]:
        return [p.sum(0).reshape(shape).to(dtype) for p, (shape, dtype) in zip(partials, finals)]
    return Launch(spec, (col_blocks, splits), [values[p] for p in scalar_params(spec)],
                  {"XBLOCK": xblock, "RBLOCK": rblock}, tuning.column_warps,
                  [((splits, n_cols), (n_cols, 1), torch.float32)] * len(stored),
                  returned(region.outputs, region.stored), finish=finish)
