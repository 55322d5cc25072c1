"""Row regions: pointwise ops plus reductions along the last dim (softmax, norms, their backwards).

A program owns XBLOCK rows and walks their columns in RBLOCK chunks. A row that fits one chunk is
*persistent*: each input is read once and every value stays in registers. A longer row takes one pass
over its columns per level of dependent reductions (softmax: max, then sum, then the output), each
pass recomputing the pointwise ops it needs, as Inductor's looped reductions do. Values that are one
per row (reduction results, [..., 1] inputs) are held as [XBLOCK, 1].
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import layout
from .ir import REDUCTIONS, Instr, NotFusible, Ref, compute_dtype, tl_type
from .launch import Launch, returned
from .region import Region
from .triton_expr import dim_indices, expression, in_compute_dtype, operand, pointers, store_value
from .tuning import Tuning, next_pow2

ROW, PER_ROW, FLAT = "row", "per_row", "flat"   # FLAT: one per row, last dim dropped (keepdim=False)


@dataclass(frozen=True)
class RowAccess:
    dtype: torch.dtype
    per_row: bool                   # one element per row, read or written once per row
    outer: tuple[bool, ...]         # the outer (row) dims with a nonzero stride


@dataclass(frozen=True)
class RowSpec:
    instrs: tuple[Instr, ...]
    per_row: tuple[bool, ...]       # per instruction
    inputs: tuple[RowAccess, ...]
    outputs: tuple[tuple[Ref, RowAccess], ...]
    outer_ndim: int
    persistent: bool
    int64: bool


def _classify(region: Region) -> tuple[dict[Ref, str], tuple[int, ...]]:
    """Each value's class and the row space's shape (the broadcast of every non-FLAT value)."""
    flat: dict[Ref, bool] = {}
    for j, ins in enumerate(region.instrs):
        if ins.op in REDUCTIONS:
            flat[Ref("t", j)] = not ins.attr("keepdim")
            continue
        kinds = {flat.get(a, False) for a in ins.args if isinstance(a, Ref) and region.shapes[a] != ()}
        if len(kinds) > 1:
            raise NotFusible(f"{ins.op} of a keepdim=False reduction and a row value is not fusible")
        flat[Ref("t", j)] = kinds.pop() if kinds else False
    rows = tuple(torch.broadcast_shapes(*(s for r, s in region.shapes.items() if not flat.get(r, False))))
    cls = {Ref("in", k): ROW if t.dim() and t.shape[-1] == rows[-1] else PER_ROW for k, t in enumerate(region.inputs)}
    for j, ins in enumerate(region.instrs):
        refs = [a for a in ins.args if isinstance(a, Ref)]
        if ins.op in REDUCTIONS:
            if cls[refs[0]] != ROW:
                raise NotFusible(f"a {ins.op} of a value constant along the row is not fusible")
            cls[Ref("t", j)] = FLAT if flat[Ref("t", j)] else PER_ROW
        else:
            kinds = {cls[a] for a in refs}
            cls[Ref("t", j)] = ROW if ROW in kinds else FLAT if flat[Ref("t", j)] else PER_ROW
    return cls, rows


def _used_dims(spec: RowSpec) -> list[int]:
    return [d for d in range(spec.outer_ndim) if any(a.outer[d] for _, a in pointers(spec))]


def scalar_params(spec: RowSpec) -> list[str]:
    dims = _used_dims(spec)
    params = ["n_rows", "n_cols"] + [f"size{d}" for d in dims if d > 0]
    params += [f"pitch{d}" for d in dims if d < spec.outer_ndim - 1]
    for p, a in pointers(spec):
        params += [f"{p}_o{d}" for d in range(spec.outer_ndim) if a.outer[d]]
        params += [] if a.per_row else [f"{p}_sc"]
    return params


_MAX_NAN = '''@triton.jit
def _max_nan(a, b):
    return tl.where((a > b) | (a != a), a, b)     # NaN wins, as in torch.amax


'''


class _Emitter:
    def __init__(self, spec: RowSpec):
        self.spec = spec
        self.body: list[str] = []
        self.outputs = {ref: m for m, (ref, _) in enumerate(spec.outputs)}

    def dtype_of(self, r: Ref) -> torch.dtype:
        return self.spec.inputs[r.index].dtype if r.kind == "in" else self.spec.instrs[r.index].dtype

    def is_row(self, r: Ref) -> bool:
        return not (self.spec.inputs[r.index].per_row if r.kind == "in" else self.spec.per_row[r.index])

    def offset(self, p: str, a: RowAccess) -> str | None:
        terms = ([f"{p}_row"] if any(a.outer) else []) + ([] if a.per_row else [f"cols * {p}_sc"])
        return " + ".join(terms) or None

    def load(self, k: int) -> None:
        a = self.spec.inputs[k]
        off = self.offset(f"in{k}", a)
        if off is None:
            load = f"tl.load(in{k})"                  # one element for all rows: a 0-dim input
        else:
            load = f"tl.load(in{k} + {off}, mask={'row_mask' if a.per_row else 'mask'}, other=0)"
        self.body.append(f"x{k} = {in_compute_dtype(load, a.dtype)}")

    def store(self, ref: Ref) -> None:
        if ref not in self.outputs:
            return
        m = self.outputs[ref]
        a = self.spec.outputs[m][1]
        # a single row has no row term; `rows * 0` keeps the offset [XBLOCK, 1] like the value
        off = self.offset(f"out{m}", a) or "rows * 0"
        value = store_value(ref, self.dtype_of, a.dtype)
        self.body.append(f"tl.store(out{m} + {off}, {value}, mask={'row_mask' if a.per_row else 'mask'})")

    def compute(self, j: int) -> None:
        self.body.append(f"t{j} = {expression(self.spec.instrs[j], self.dtype_of)}")

    def reduced(self, j: int, whole: str) -> str:
        """The [XBLOCK, 1] result of reduction j over `whole`, an [XBLOCK, RBLOCK] block."""
        ins = self.spec.instrs[j]
        if ins.op == "amax":
            return f"tl.reduce({whole}, 1, _max_nan)[:, None]"
        total = f"tl.sum({whole}, 1)[:, None]"
        if ins.op == "sum":
            return total
        correction = ins.attr("correction")
        return f"{total} / (n_cols - {correction})" if correction else f"{total} / n_cols"

    def masked(self, j: int) -> str:
        ins = self.spec.instrs[j]
        identity = 'float("-inf")' if ins.op == "amax" else "0"
        return f"tl.where(mask, {operand(ins.args[0], ins.arg_dtypes[0], self.dtype_of)}, {identity})"

    def persistent(self) -> None:
        self.body += ["cols = cols0", "mask = row_mask & (cols < n_cols)"]
        used = {a for ins in self.spec.instrs for a in ins.args if isinstance(a, Ref)}
        for k, a in enumerate(self.spec.inputs):
            if not a.per_row and Ref("in", k) in used:
                self.load(k)
        for j, ins in enumerate(self.spec.instrs):
            if ins.op in REDUCTIONS:
                self.body.append(f"t{j} = {self.reduced(j, self.masked(j))}")
            else:
                self.compute(j)
            self.store(Ref("t", j))

    def looped(self) -> None:
        instrs = self.spec.instrs
        level: dict[Ref, int] = {Ref("in", k): 0 for k in range(len(self.spec.inputs))}
        for j, ins in enumerate(instrs):
            deepest = max((level[a] for a in ins.args if isinstance(a, Ref)), default=0)
            level[Ref("t", j)] = deepest + (ins.op in REDUCTIONS)
        per_row = [j for j in range(len(instrs)) if instrs[j].op not in REDUCTIONS and self.spec.per_row[j]]
        for p in range(max(level.values()) + 1):
            for j in per_row:                    # one-per-row values whose inputs the last pass finished
                if level[Ref("t", j)] == p:
                    self.compute(j)
                    self.store(Ref("t", j))
            reductions = [j for j in range(len(instrs)) if instrs[j].op in REDUCTIONS and level[Ref("t", j)] == p + 1]
            stores = [r for r in self.outputs if self.is_row(r) and level[r] == p]
            if reductions or stores:
                self.walk(reductions, stores)

    def walk(self, reductions: list[int], stores: list[Ref]) -> None:
        """One pass over the columns: accumulate `reductions`, store the row values `stores`."""
        instrs = self.spec.instrs
        for j in reductions:
            init = 'float("-inf")' if instrs[j].op == "amax" else "0"
            self.body.append(f"acc{j} = tl.full([XBLOCK, RBLOCK], {init}, {tl_type(compute_dtype(instrs[j].dtype))})")
        self.body += ["for off in range(0, n_cols, RBLOCK):",
                      "    cols = off + cols0", "    mask = row_mask & (cols < n_cols)"]
        needed: set[Ref] = set()
        stack = [instrs[j].args[0] for j in reductions] + stores
        while stack:
            r = stack.pop()
            if r not in needed and self.is_row(r):
                needed.add(r)
                stack += [a for a in instrs[r.index].args if isinstance(a, Ref)] if r.kind == "t" else []
        outer = self.body
        self.body = []
        for k in range(len(self.spec.inputs)):
            if Ref("in", k) in needed:
                self.load(k)
        for j in range(len(instrs)):
            if Ref("t", j) in needed:
                self.compute(j)
        for r in stores:
            self.store(r)
        for j in reductions:
            merged = f"_max_nan(acc{j}, {self.masked(j)})" if instrs[j].op == "amax" else f"acc{j} + {self.masked(j)}"
            self.body.append(f"acc{j} = {merged}")
        outer += ["    " + line for line in self.body]
        self.body = outer
        for j in reductions:
            self.body.append(f"t{j} = {self.reduced(j, f'acc{j}')}")
            self.store(Ref("t", j))


def emit(spec: RowSpec) -> str:
    e = _Emitter(spec)
    pid = "tl.program_id(0).to(tl.int64)" if spec.int64 else "tl.program_id(0)"
    e.body += [f"rows = {pid} * XBLOCK + tl.arange(0, XBLOCK)[:, None]", "row_mask = rows < n_rows"]
    e.body += dim_indices("rows", "r", _used_dims(spec), spec.outer_ndim)
    for p, a in pointers(spec):
        if any(a.outer):
            e.body.append(f"{p}_row = " + " + ".join(f"r{d} * {p}_o{d}" for d in range(spec.outer_ndim) if a.outer[d]))
    e.body.append("cols0 = tl.arange(0, RBLOCK)[None, :]")
    for k, a in enumerate(spec.inputs):
        if a.per_row and any(Ref("in", k) in ins.args for ins in spec.instrs):
            e.load(k)
    if spec.persistent:
        e.persistent()
    else:
        e.looped()
    params = [p for p, _ in pointers(spec)] + scalar_params(spec) + ["XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr"]
    helper = _MAX_NAN if any(i.op == "amax" for i in spec.instrs) else ""
    return (helper + f"@triton.jit\ndef kernel({', '.join(params)}):\n"
            + "\n".join("    " + line for line in e.body) + "\n")


def plan(region: Region, tuning: Tuning) -> Launch:
    cls, rows = _classify(region)
    outer_shape, n_cols = rows[:-1], rows[-1]
    wanted = {ROW: rows, PER_ROW: outer_shape + (1,), FLAT: outer_shape}
    for ref, v in region.stored:
        if tuple(v.shape) != wanted[cls[ref]]:
            raise NotFusible(f"an output of shape {tuple(v.shape)} is not fusible with rows of shape {rows}")
    full = [layout.broadcast_strides(t.shape, t.stride(), rows) for t in region.inputs]
    full += [tuple(v.stride()) if cls[ref] == ROW else tuple(v.stride())[:len(outer_shape)] + (0,)
             for ref, v in region.stored]
    sizes, outer = layout.iteration_dims(outer_shape, [st[:-1] for st in full],
                                         order_by=len(region.inputs) if region.stored else None)
    classes = [cls[Ref("in", k)] for k in range(len(region.inputs))] + [cls[ref] for ref, _ in region.stored]
    accesses = [RowAccess(dt, c != ROW, tuple(s != 0 for s in st)) for dt, c, st in
                zip([t.dtype for t in region.inputs] + [v.dtype for _, v in region.stored], classes, outer)]
    persistent = next_pow2(n_cols) <= tuning.persistent_cols
    spec = RowSpec(
        instrs=tuple(region.instrs),
        per_row=tuple(cls[Ref("t", j)] != ROW for j in range(len(region.instrs))),
        inputs=tuple(accesses[:len(region.inputs)]),
        outputs=tuple(zip([ref for ref, _ in region.stored], accesses[len(region.inputs):])),
        outer_ndim=len(sizes), persistent=persistent, int64=layout.needs_int64(rows, full))
    n_rows = math.prod(outer_shape)
    values = {"n_rows": n_rows, "n_cols": n_cols}
    values |= {f"size{d}": n for d, n in enumerate(sizes)}
    values |= {f"pitch{d}": p for d, p in enumerate(layout.pitches(sizes))}
    for (p, _), st, st_full in zip(pointers(spec), outer, full):
        values |= {f"{p}_o{d}": s for d, s in enumerate(st)} | {f"{p}_sc": st_full[-1]}
    rblock = next_pow2(n_cols) if persistent else tuning.loop_cols
    xblock = max(1, min(next_pow2(n_rows), tuning.row_tile // rblock))
    grid = (-(-n_rows // xblock) if region.stored else 0,)
    return Launch(spec, grid, [values[p] for p in scalar_params(spec)], {"XBLOCK": xblock, "RBLOCK": rblock},
                  tuning.warps_for_rows(xblock * rblock), region.allocs,
                  returned(region.outputs, region.stored))
