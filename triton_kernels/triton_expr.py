"""Primitive instruction -> one line of Triton. Shared by the pointwise and row emitters.

Values live in registers in compute_dtype (fp32 for half types); an operand is converted only where
an instruction computes in another dtype.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from .ir import Instr, Operand, Ref, compute_dtype, tl_type

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "and": "&", "or": "|", "xor": "^",
          "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_CALLS = {"exp": "tl.exp", "log": "tl.log", "exp2": "tl.exp2", "log2": "tl.log2", "sqrt": "tl.sqrt_rn",
          "rsqrt": "tl.rsqrt", "sigmoid": "tl.sigmoid", "erf": "tl.erf", "abs": "tl.abs"}


def pointers(spec) -> list[tuple[str, Any]]:
    """A kernel's pointer parameters, inputs then stored outputs, each with its access pattern."""
    return ([(f"in{k}", a) for k, a in enumerate(spec.inputs)]
            + [(f"out{m}", a) for m, (_, a) in enumerate(spec.outputs)])


def dim_indices(flat: str, prefix: str, dims, ndim: int) -> list[str]:
    """`{prefix}{d} = ` dim d's index in the row-major walk of an ndim-dim space, for each used dim d,
    from the flat index `flat` (sizes `size{d}`, pitches `pitch{d}` are kernel parameters)."""
    return [f"{prefix}{d} = " + (flat if d == ndim - 1 else f"{flat} // pitch{d}") + (f" % size{d}" if d > 0 else "")
            for d in dims]


def in_compute_dtype(load: str, dtype: torch.dtype) -> str:
    """A loaded value of `dtype`, converted to the dtype it is computed in."""
    return load if compute_dtype(dtype) == dtype else f"{load}.to({tl_type(compute_dtype(dtype))})"


def name(ref: Ref) -> str:
    return f"x{ref.index}" if ref.kind == "in" else f"t{ref.index}"


def literal(v: bool | int | float) -> str:
    if isinstance(v, (bool, int)):
        return repr(v)
    if math.isnan(v):
        return 'float("nan")'
    if math.isinf(v):
        return 'float("inf")' if v > 0 else 'float("-inf")'
    return repr(float(v))


def converted(text: str, held: torch.dtype, wanted: torch.dtype) -> str:
    """`text`, a value of dtype `held` (kept in its compute dtype), as compute_dtype(wanted)."""
    src, dst = compute_dtype(held), compute_dtype(wanted)
    if dst == src:
        return text
    return f"({text} != 0)" if dst == torch.bool else f"{text}.to({tl_type(dst)})"


def operand(a: Operand, wanted: torch.dtype | None, dtype_of: Callable[[Ref], torch.dtype]) -> str:
    return converted(name(a), dtype_of(a), wanted) if isinstance(a, Ref) else literal(a)


def _cast(x: str, held: torch.dtype, dtype: torch.dtype) -> str:
    """An explicit cast rounds to a half type even though the value stays in fp32, as eager does."""
    if dtype in (torch.float16, torch.bfloat16) and held != dtype:
        return f"{x}.to({tl_type(dtype)}).to(tl.float32)"
    return converted(x, held, dtype)


def expression(instr: Instr, dtype_of: Callable[[Ref], torch.dtype]) -> str:
    """The Triton expression of a pointwise instruction."""
    a = [operand(x, d, dtype_of) for x, d in zip(instr.args, instr.arg_dtypes)]
    op = instr.op
    if op in _INFIX:
        return f"{a[0]} {_INFIX[op]} {a[1]}"
    if op in _CALLS:
        return f"{_CALLS[op]}({a[0]})"
    if op == "neg":
        return f"-{a[0]}"
    if op == "invert":
        return f"~{a[0]}"
    if op == "tanh":             # tl has no tanh and libdevice does not run in the interpreter
        return f"2 * tl.sigmoid(2 * {a[0]}) - 1"
    if op == "relu":             # NaN stays NaN, as in eager
        return f"tl.where({a[0]} < 0, 0, {a[0]})"
    if op in ("maximum", "minimum"):
        nan = ", propagate_nan=tl.PropagateNan.ALL" if instr.dtype.is_floating_point else ""
        return f"tl.{op}({a[0]}, {a[1]}{nan})"
    if op == "where":
        return f"tl.where({a[0]}, {a[1]}, {a[2]})"
    if op == "cast":
        return _cast(name(instr.args[0]), instr.arg_dtypes[0], instr.dtype)
    raise AssertionError(f"no Triton expression for primitive {op!r}")


def store_value(ref: Ref, dtype_of: Callable[[Ref], torch.dtype], out_dtype: torch.dtype) -> str:
    """A value converted to the dtype of the tensor it is stored in (round to nearest even)."""
    held = dtype_of(ref)
    text = name(ref)
    return text if compute_dtype(held) == out_dtype else f"{text}.to({tl_type(out_dtype)})"
