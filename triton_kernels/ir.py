"""The primitive instructions that aten ops lower to, and the builder that records a region in them.

A region becomes a straight-line list of `Instr`s over kernel inputs and earlier results; the kernel
emitters print each primitive as one Triton expression (see triton_expr), so the aten vocabulary lives
in lowering.py and the Triton vocabulary in triton_expr.py, and neither knows the other.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Union

import torch


class NotFusible(ValueError):
    """An op, dtype or shape that cannot go into a generated kernel; the message names it in one line."""


class Ref(NamedTuple):
    kind: str      # "in": the index-th kernel input; "t": the result of instruction `index`
    index: int


Operand = Union[Ref, bool, int, float]

REDUCTIONS = frozenset({"sum", "amax", "mean"})   # over the last dim; `mean` divides by (n - correction)
COLUMN_SUM = "colsum"       # a sum over every dim but the last (colwise: bias and LayerNorm weight gradients)


@dataclass(frozen=True)
class Instr:
    op: str
    args: tuple                 # Ref or Python scalar
    arg_dtypes: tuple           # the dtype each Ref operand is computed in; None for constants
    dtype: torch.dtype          # the result's dtype; the kernel holds it in compute_dtype(dtype)
    attrs: tuple = ()           # sorted (name, value) pairs, e.g. (("correction", 1),)

    def attr(self, name: str, default=None):
        return dict(self.attrs).get(name, default)


_TL_TYPES = {
    torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
    torch.bool: "tl.int1", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.int16: "tl.int16",
    torch.int32: "tl.int32", torch.int64: "tl.int64",
}


def check_dtype(dtype: torch.dtype, what: str) -> torch.dtype:
    if dtype not in _TL_TYPES:
        raise NotFusible(f"{what} has dtype {dtype}, which is not fusible")
    return dtype


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision values are computed in fp32 and rounded once on store, as Inductor does."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def tl_type(dtype: torch.dtype) -> str:
    return _TL_TYPES[dtype]


def dtype_of(x: Operand, dtypes: dict[Ref, torch.dtype]) -> torch.dtype:
    if isinstance(x, Ref):
        return dtypes[x]
    return torch.bool if isinstance(x, bool) else torch.int64 if isinstance(x, int) else torch.float32


class Builder:
    """Appends instructions and tracks each value's dtype and (broadcast) shape. An instruction equal to
    an earlier one returns the earlier result: traced aten graphs repeat subexpressions."""

    def __init__(self):
        self.instrs: list[Instr] = []
        self._existing: dict[Instr, Ref] = {}
        self.dtypes: dict[Ref, torch.dtype] = {}
        self.shapes: dict[Ref, tuple[int, ...]] = {}

    def input(self, index: int, t: torch.Tensor) -> Ref:
        ref = Ref("in", index)
        self.dtypes[ref] = check_dtype(t.dtype, f"input {index}")
        self.shapes[ref] = tuple(t.shape)
        return ref

    def op(self, name: str, *args: Operand, dtype: torch.dtype, arg_dtype: torch.dtype | None = None,
           arg_dtypes: tuple | None = None, shape: tuple[int, ...] | None = None, **attrs) -> Ref:
        """`arg_dtype` (default: `dtype`) is what every Ref operand is computed in; `arg_dtypes` sets it
        per operand instead."""
        if arg_dtypes is None:
            arg_dtypes = tuple((arg_dtype or dtype) if isinstance(a, Ref) else None for a in args)
        if shape is None:
            shape = tuple(torch.broadcast_shapes(*(self.shapes[a] for a in args if isinstance(a, Ref))))
        instr = Instr(name, tuple(args), arg_dtypes, check_dtype(dtype, name), tuple(sorted(attrs.items())))
        if instr in self._existing:
            return self._existing[instr]
        ref = self._existing[instr] = Ref("t", len(self.instrs))
        self.instrs.append(instr)
        self.dtypes[ref] = dtype
        self.shapes[ref] = shape
        return ref

    def promote(self, x: Operand, y: Operand) -> torch.dtype:
        """torch's result type of a binary op on x and y (a 0-dim tensor ranks below a dimensioned one)."""
        def probe(v):
            return torch.empty(self.shapes[v], dtype=self.dtypes[v], device="meta") if isinstance(v, Ref) else v
        return torch.result_type(probe(x), probe(y))


def prune(instrs: list[Instr], roots: list[Ref]) -> tuple[list[Instr], dict[Ref, Ref]]:
    """Drop instructions no root needs; returns the kept ones renumbered and the old -> new Ref map."""
    live: set[int] = {r.index for r in roots if r.kind == "t"}
    for j in range(len(instrs) - 1, -1, -1):
        if j in live:
            live.update(a.index for a in instrs[j].args if isinstance(a, Ref) and a.kind == "t")
    renumber = {Ref("t", j): Ref("t", k) for k, j in enumerate(sorted(live))}

    def remap(a):
        return renumber.get(a, a) if isinstance(a, Ref) else a
    kept = [Instr(i.op, tuple(remap(a) for a in i.args), i.arg_dtypes, i.dtype, i.attrs)
            for j, i in enumerate(instrs) if j in live]
    return kept, renumber


def registrar(rules: dict) -> Callable:
    """`@lowers(*targets)`: record the decorated rule in `rules` under each aten target."""
    def lowers(*targets) -> Callable:
        def register(rule):
            for t in targets:
                rules[t] = rule
            return rule
        return register
    return lowers
