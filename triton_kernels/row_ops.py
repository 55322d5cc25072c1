"""Last-dim reductions, and the row ops built from them -> primitive instructions.

softmax, log_softmax, LayerNorm and their backwards decompose into the three reductions `sum`, `amax`
and `mean` plus pointwise primitives, in fp32, with no size baked in (`mean` divides by the row length
at run time), so one kernel serves every row length. Rule signature as in pointwise_ops.
"""
from __future__ import annotations

import torch

from .ir import COLUMN_SUM, Builder, NotFusible, Ref, registrar

aten = torch.ops.aten

RULES: dict = {}
_F32 = torch.float32


_lowers = registrar(RULES)


def _check_last(op: str, dims, rank: int) -> None:
    dims = [dims] if isinstance(dims, int) else list(dims or range(rank))   # None or [] = all dims
    if rank == 0 or [d % rank for d in dims] != [rank - 1]:
        raise NotFusible(f"{op} over dims {dims} is not fusible: only last-dim reductions are")


def _reduce(b: Builder, prim: str, x: Ref, dtype: torch.dtype, keepdim: bool = True, correction: int = 0) -> Ref:
    if not dtype.is_floating_point:
        raise NotFusible(f"a {prim} reduction in {dtype} is not fusible: only floating-point reductions are")
    shape = b.shapes[x][:-1] + ((1,) if keepdim else ())
    attrs = {"keepdim": keepdim} | ({"correction": correction} if prim == "mean" else {})
    return b.op(prim, x, dtype=dtype, shape=shape, **attrs)


def _cast(b: Builder, x: Ref, dtype: torch.dtype) -> Ref:
    return x if b.dtypes[x] == dtype else b.op("cast", x, dtype=dtype, arg_dtype=b.dtypes[x])


@_lowers(aten.sum.dim_IntList)
def _sum(b, out, x, dim, keepdim=False, dtype=None):
    rank = len(b.shapes[x])
    if rank >= 2 and dim is not None and sorted(d % rank for d in dim) == list(range(rank - 1)):
        return _column_sum(b, x, out.dtype, tuple(out.shape))
    _check_last("aten.sum.dim_IntList", dim, rank)
    return _reduce(b, "sum", x, out.dtype, keepdim)


def _column_sum(b: Builder, x: Ref, dtype: torch.dtype, shape: tuple[int, ...]) -> Ref:
    """A sum over every dim but the last (accumulated in fp32, rounded once to `dtype`)."""
    if not dtype.is_floating_point:
        raise NotFusible(f"a column sum in {dtype} is not fusible: only floating-point sums are")
    return b.op(COLUMN_SUM, x, dtype=dtype, arg_dtype=_F32, shape=shape)


@_lowers(aten.mean.dim)
def _mean(b, out, x, dim, keepdim=False, dtype=None):
    _check_last("aten.mean.dim", dim, len(b.shapes[x]))
    return _reduce(b, "mean", x, out.dtype, keepdim)


@_lowers(aten.amax.default)
def _amax(b, out, x, dim=(), keepdim=False):
    _check_last("aten.amax.default", dim, len(b.shapes[x]))
    return _reduce(b, "amax", x, out.dtype, keepdim)


def _var(b: Builder, x: Ref, correction, keepdim: bool, dtype) -> Ref:
    """Two-pass variance: mean first, then the mean of squared deviations (stable for large means)."""
    d = b.op("sub", x, _reduce(b, "mean", x, _F32), dtype=_F32)
    var = _reduce(b, "mean", b.op("mul", d, d, dtype=_F32), _F32, keepdim, 1 if correction is None else correction)
    return _cast(b, var, dtype)


@_lowers(aten.var.correction)
def _var_correction(b, out, x, dim=None, *, correction=None, keepdim=False):
    _check_last("aten.var.correction", dim, len(b.shapes[x]))
    return _var(b, x, correction, keepdim, out.dtype)


@_lowers(aten.var_mean.correction)
def _var_mean(b, out, x, dim=None, *, correction=None, keepdim=False):
    _check_last("aten.var_mean.correction", dim, len(b.shapes[x]))
    return _var(b, x, correction, keepdim, out[0].dtype), _cast(b, _reduce(b, "mean", x, _F32, keepdim), out[1].dtype)


def _check_softmax_dim(op: str, b: Builder, x: Ref, dim: int) -> None:
    rank = len(b.shapes[x])
    if rank and dim % rank != rank - 1:
        raise NotFusible(f"{op} over dim {dim} is not fusible: only last-dim softmax is")


@_lowers(aten._softmax.default)
def _softmax(b, out, x, dim, half_to_float):
    _check_softmax_dim("aten._softmax.default", b, x, dim)
    dt = out.dtype
    e = b.op("exp", b.op("sub", x, _reduce(b, "amax", x, dt), dtype=dt), dtype=dt)
    return b.op("div", e, _reduce(b, "sum", e, dt), dtype=dt)


@_lowers(aten._log_softmax.default)
def _log_softmax(b, out, x, dim, half_to_float):
    _check_softmax_dim("aten._log_softmax.default", b, x, dim)
    dt = out.dtype
    shifted = b.op("sub", x, _reduce(b, "amax", x, dt), dtype=dt)
    total = _reduce(b, "sum", b.op("exp", shifted, dtype=dt), dt)
    return b.op("sub", shifted, b.op("log", total, dtype=dt), dtype=dt)


@_lowers(aten._softmax_backward_data.default)
def _softmax_backward(b, out, grad, y, dim, input_dtype):
    _check_softmax_dim("aten._softmax_backward_data.default", b, y, dim)
    dt = out.dtype
    gy = b.op("mul", grad, y, dtype=dt)
    return b.op("sub", gy, b.op("mul", y, _reduce(b, "sum", gy, dt), dtype=dt), dtype=dt)


@_lowers(aten._log_softmax_backward_data.default)
def _log_softmax_backward(b, out, grad, y, dim, input_dtype):
    _check_softmax_dim("aten._log_softmax_backward_data.default", b, y, dim)
    dt = out.dtype
    p = b.op("exp", y, dtype=dt)
    return b.op("sub", grad, b.op("mul", p, _reduce(b, "sum", grad, dt), dtype=dt), dtype=dt)


def _check_normalized_shape(op: str, normalized_shape) -> None:
    if len(normalized_shape) != 1:
        raise NotFusible(f"{op} over {len(normalized_shape)} dims is not fusible: only last-dim norms are")


@_lowers(aten.native_layer_norm.default)
def _layer_norm(b, out, x, normalized_shape, weight, bias, eps):
    _check_normalized_shape("aten.native_layer_norm.default", normalized_shape)
    mean = _reduce(b, "mean", x, _F32)
    d = b.op("sub", x, mean, dtype=_F32)
    rstd = b.op("rsqrt", b.op("add", _reduce(b, "mean", b.op("mul", d, d, dtype=_F32), _F32), eps, dtype=_F32),
                dtype=_F32)
    y = b.op("mul", d, rstd, dtype=_F32)
    if weight is not None:
        y = b.op("mul", y, weight, dtype=_F32)
    if bias is not None:
        y = b.op("add", y, bias, dtype=_F32)
    return _cast(b, y, out[0].dtype), _cast(b, mean, out[1].dtype), _cast(b, rstd, out[2].dtype)


@_lowers(aten.native_layer_norm_backward.default)
def _layer_norm_backward(b, out, grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    _check_normalized_shape("aten.native_layer_norm_backward.default", normalized_shape)
    if not output_mask[0]:      # only the weight/bias gradients: sums over the rows (colwise)
        xhat = b.op("mul", b.op("sub", x, mean, dtype=_F32), rstd, dtype=_F32)
        grad_weight = _column_sum(b, b.op("mul", grad, xhat, dtype=_F32), out[1].dtype, tuple(out[1].shape)) \
            if output_mask[1] and weight is not None else None
        grad_bias = _column_sum(b, grad, out[2].dtype, tuple(out[2].shape)) if output_mask[2] and bias is not None else None
        return None, grad_weight, grad_bias
    if output_mask[1] or output_mask[2]:
        raise NotFusible("aten.native_layer_norm_backward.default with the input gradient and grad_weight or "
                         "grad_bias is not fusible: split it (fusion does), the sums run over rows, not along them")
    # dx = rstd * (g' - mean(g') - xhat * mean(g' * xhat)), g' = grad * weight
    xhat = b.op("mul", b.op("sub", x, mean, dtype=_F32), rstd, dtype=_F32)
    gw = grad if weight is None else b.op("mul", grad, weight, dtype=_F32)
    centered = b.op("sub", gw, _reduce(b, "mean", gw, _F32), dtype=_F32)
    proj = b.op("mul", xhat, _reduce(b, "mean", b.op("mul", gw, xhat, dtype=_F32), _F32), dtype=_F32)
    dx = b.op("mul", b.op("sub", centered, proj, dtype=_F32), rstd, dtype=_F32)
    return _cast(b, dx, out[0].dtype), None, None
