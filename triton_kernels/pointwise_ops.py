"""Pointwise aten ops -> primitive instructions.

A rule takes the builder, the node's fake output and the node's arguments (Refs for tensors, Python
scalars as they are) and returns the Ref of its result. Results carry the node's dtype; everything in
between is computed in compute_dtype (fp32 for half types). Explicit casts round (see triton_expr).
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from .ir import Builder, NotFusible, Operand, Ref, registrar

aten, prims = torch.ops.aten, torch.ops.prims

RULES: dict = {}


_lowers = registrar(RULES)


def _simple(prim: str) -> Callable:
    def rule(b: Builder, out, *args):
        return b.op(prim, *args, dtype=out.dtype)
    return rule


for _target, _prim in {
    aten.neg.default: "neg", aten.exp.default: "exp", aten.log.default: "log", aten.tanh.default: "tanh",
    aten.sigmoid.default: "sigmoid", aten.sqrt.default: "sqrt", aten.rsqrt.default: "rsqrt",
    aten.abs.default: "abs", aten.erf.default: "erf", aten.relu.default: "relu",
    aten.mul.Tensor: "mul", aten.mul.Scalar: "mul", aten.div.Tensor: "div", aten.div.Scalar: "div",
    aten.maximum.default: "maximum", aten.minimum.default: "minimum",
}.items():
    RULES[_target] = _simple(_prim)


def _scaled(b: Builder, y: Operand, alpha, dtype) -> Operand:
    if alpha == 1:
        return y
    return b.op("mul", y, alpha, dtype=dtype) if isinstance(y, Ref) else y * alpha


@_lowers(aten.add.Tensor, aten.add.Scalar)
def _add(b, out, x, y, alpha=1):
    return b.op("add", x, _scaled(b, y, alpha, out.dtype), dtype=out.dtype)


@_lowers(aten.sub.Tensor, aten.sub.Scalar)
def _sub(b, out, x, y, alpha=1):
    return b.op("sub", x, _scaled(b, y, alpha, out.dtype), dtype=out.dtype)


@_lowers(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(b, out, x, y, alpha=1):
    return b.op("sub", y, _scaled(b, x, alpha, out.dtype), dtype=out.dtype)


@_lowers(aten.reciprocal.default)
def _reciprocal(b, out, x):
    return b.op("div", 1.0, x, dtype=out.dtype)


def _round_to(c: Operand, dtype: torch.dtype) -> Operand:
    """A float constant compared in a half type is rounded to it first, as eager does."""
    if isinstance(c, float) and dtype in (torch.float16, torch.bfloat16):
        return float(torch.tensor(c, dtype=dtype))
    return c


def _comparison(prim: str) -> Callable:
    def rule(b: Builder, out, x, y):
        common = b.promote(x, y)
        return b.op(prim, _round_to(x, common), _round_to(y, common), dtype=torch.bool, arg_dtype=common)
    return rule


for _name in ("lt", "le", "gt", "ge", "eq", "ne"):
    for _overload in ("Tensor", "Scalar"):
        RULES[getattr(getattr(aten, _name), _overload)] = _comparison(_name)


for _target, _prim in {aten.bitwise_and.Tensor: "and", aten.bitwise_or.Tensor: "or",
                       aten.bitwise_xor.Tensor: "xor", aten.bitwise_not.default: "invert"}.items():
    RULES[_target] = _simple(_prim)


@_lowers(aten.logical_not.default)
def _logical_not(b, out, x):
    return b.op("eq", x, 0, dtype=torch.bool, arg_dtype=b.dtypes[x])


@_lowers(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(b, out, cond, x, y):
    return b.op("where", cond, x, y, dtype=out.dtype,
                arg_dtypes=tuple(d if isinstance(a, Ref) else None
                                 for a, d in zip((cond, x, y), (torch.bool, out.dtype, out.dtype))))


@_lowers(aten.clamp.default, aten.clamp.Tensor)
def _clamp(b, out, x, min=None, max=None):
    if min is not None:
        x = b.op("maximum", x, min, dtype=out.dtype)
    if max is not None:
        x = b.op("minimum", x, max, dtype=out.dtype)
    return x


@_lowers(aten.clamp_min.default, aten.clamp_min.Tensor)
def _clamp_min(b, out, x, min):
    return _clamp(b, out, x, min=min)


@_lowers(aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp_max(b, out, x, max):
    return _clamp(b, out, x, max=max)


def _cast(b: Builder, x: Ref, dtype: torch.dtype) -> Ref:
    return b.op("cast", x, dtype=dtype, arg_dtype=b.dtypes[x])


@_lowers(aten._to_copy.default)
def _to_copy(b, out, x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    if layout not in (None, torch.strided) or (device is not None and torch.device(device) != out.device):
        raise NotFusible("aten._to_copy.default to another device or layout is not fusible")
    return _cast(b, x, out.dtype)        # output strides come from the fake output, so memory_format holds


@_lowers(prims.convert_element_type.default)
def _convert_element_type(b, out, x, dtype):
    return _cast(b, x, out.dtype)


@_lowers(aten.clone.default)
def _clone(b, out, x, memory_format=None):
    return _cast(b, x, out.dtype)


@_lowers(aten.scalar_tensor.default)
def _scalar_tensor(b, out, value, dtype=None, layout=None, device=None, pin_memory=None):
    """A 0-dim constant: folded into the expressions that use it."""
    if out.dtype == torch.bool:
        return bool(value)
    return float(value) if out.dtype.is_floating_point else int(value)


@_lowers(aten.pow.Tensor_Scalar)
def _pow(b, out, x, exponent):
    dt = out.dtype
    if exponent == 0:
        return b.op("where", b.op("eq", x, x, dtype=torch.bool, arg_dtype=dt), 1.0, 1.0, dtype=dt,
                    arg_dtypes=(torch.bool, None, None))          # 1 everywhere, NaN included
    if exponent == 0.5:
        return b.op("sqrt", x, dtype=dt)
    if exponent == -0.5:
        return b.op("rsqrt", x, dtype=dt)
    if float(exponent).is_integer() and abs(exponent) <= 8:
        p = _integer_power(b, x, abs(int(exponent)), dt)
        return p if exponent > 0 else b.op("div", 1.0, p, dtype=dt)
    if not dt.is_floating_point:
        raise NotFusible(f"aten.pow.Tensor_Scalar of {dt} by {exponent} is not fusible")
    # |x|^e = 2^(e log2|x|); an odd integer power keeps x's sign, a fractional one of x < 0 is NaN
    odd = float(exponent).is_integer() and int(exponent) % 2 == 1
    base = b.op("abs", x, dtype=dt) if float(exponent).is_integer() else x
    r = b.op("exp2", b.op("mul", b.op("log2", base, dtype=dt), float(exponent), dtype=dt), dtype=dt)
    if odd:
        r = b.op("where", b.op("lt", x, 0, dtype=torch.bool, arg_dtype=dt), b.op("neg", r, dtype=dt), r, dtype=dt,
                 arg_dtypes=(torch.bool, dt, dt))
    return r


def _integer_power(b: Builder, x: Ref, n: int, dt) -> Ref:
    """x**n by repeated squaring (n >= 1): exact for integers, one rounding per multiply for floats."""
    result, square = None, x
    while n:
        if n & 1:
            result = square if result is None else b.op("mul", result, square, dtype=dt)
        n >>= 1
        if n:
            square = b.op("mul", square, square, dtype=dt)
    return result


_SQRT1_2 = math.sqrt(0.5)
_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)
_GELU_C = 0.044715


def _gelu_tanh_inner(b: Builder, x: Ref, dt) -> tuple[Ref, Ref]:
    """(x^2, sqrt(2/pi) * (x + 0.044715 x^3)) of the tanh approximation."""
    x2 = b.op("mul", x, x, dtype=dt)
    cubic = b.op("add", b.op("mul", x2, _GELU_C, dtype=dt), 1.0, dtype=dt)
    return x2, b.op("mul", b.op("mul", x, cubic, dtype=dt), _SQRT_2_OVER_PI, dtype=dt)


def _gelu_cdf(b: Builder, x: Ref, dt) -> Ref:
    """Phi(x) = 0.5 (1 + erf(x / sqrt 2))."""
    erf = b.op("erf", b.op("mul", x, _SQRT1_2, dtype=dt), dtype=dt)
    return b.op("mul", b.op("add", erf, 1.0, dtype=dt), 0.5, dtype=dt)


@_lowers(aten.gelu.default)
def _gelu(b, out, x, approximate="none"):
    dt = out.dtype
    if approximate == "tanh":
        # 0.5 (1 + tanh z) == sigmoid(2z): no cancellation where tanh z is near -1
        _, z = _gelu_tanh_inner(b, x, dt)
        return b.op("mul", x, b.op("sigmoid", b.op("mul", z, 2.0, dtype=dt), dtype=dt), dtype=dt)
    return b.op("mul", x, _gelu_cdf(b, x, dt), dtype=dt)


@_lowers(aten.gelu_backward.default)
def _gelu_backward(b, out, grad, x, approximate="none"):
    dt = out.dtype
    if approximate == "tanh":
        # with s = sigmoid(2z): d/dx [x s] = s + 2 x s (1 - s) z'
        x2, z = _gelu_tanh_inner(b, x, dt)
        s = b.op("sigmoid", b.op("mul", z, 2.0, dtype=dt), dtype=dt)
        dz = b.op("mul", b.op("add", b.op("mul", x2, 3 * _GELU_C, dtype=dt), 1.0, dtype=dt), _SQRT_2_OVER_PI, dtype=dt)
        s1 = b.op("mul", s, b.op("sub", 1.0, s, dtype=dt), dtype=dt)
        slope = b.op("mul", b.op("mul", b.op("mul", x, s1, dtype=dt), dz, dtype=dt), 2.0, dtype=dt)
        return b.op("mul", grad, b.op("add", s, slope, dtype=dt), dtype=dt)
    cdf = _gelu_cdf(b, x, dt)
    pdf = b.op("mul", b.op("exp", b.op("mul", b.op("mul", x, x, dtype=dt), -0.5, dtype=dt), dtype=dt),
               _INV_SQRT_2PI, dtype=dt)
    return b.op("mul", grad, b.op("add", cdf, b.op("mul", x, pdf, dtype=dt), dtype=dt), dtype=dt)


@_lowers(aten.silu.default)
def _silu(b, out, x):
    return b.op("mul", x, b.op("sigmoid", x, dtype=out.dtype), dtype=out.dtype)


@_lowers(aten.silu_backward.default)
def _silu_backward(b, out, grad, x):
    dt = out.dtype
    s = b.op("sigmoid", x, dtype=dt)
    inner = b.op("add", b.op("mul", x, b.op("sub", 1.0, s, dtype=dt), dtype=dt), 1.0, dtype=dt)
    return b.op("mul", b.op("mul", grad, s, dtype=dt), inner, dtype=dt)


@_lowers(aten.sigmoid_backward.default)
def _sigmoid_backward(b, out, grad, y):
    dt = out.dtype
    return b.op("mul", b.op("mul", grad, b.op("sub", 1.0, y, dtype=dt), dtype=dt), y, dtype=dt)


@_lowers(aten.tanh_backward.default)
def _tanh_backward(b, out, grad, y):
    dt = out.dtype
    return b.op("mul", grad, b.op("sub", 1.0, b.op("mul", y, y, dtype=dt), dtype=dt), dtype=dt)


@_lowers(aten.threshold_backward.default)
def _threshold_backward(b, out, grad, x, threshold):
    below = b.op("le", x, _round_to(threshold, b.dtypes[x]), dtype=torch.bool, arg_dtype=b.dtypes[x])
    return b.op("where", below, 0, grad, dtype=out.dtype, arg_dtypes=(torch.bool, None, out.dtype))

