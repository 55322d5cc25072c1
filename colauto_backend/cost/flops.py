"""FLOP formulas per aten op, as sympy expressions; one registry, filled by `@formula(...)`.

Conventions follow `torch.utils.flop_counter` (a multiply-add is 2 FLOPs; only matmul-class work is
counted; causal masking is ignored, the dense work is counted) so the totals are comparable with
FlopCounterMode, but each formula is written here from the math. Ops with no formula and not known
to be memory-bound are reported as unknown cost by `classify`.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .shapes import Expr, ZERO, prod, shape

aten = torch.ops.aten
Formula = Callable[..., Expr]
FORMULAS: dict[Any, Formula] = {}


def formula(*packets: Any) -> Callable[[Formula], Formula]:
    def register(fn: Formula) -> Formula:
        for p in packets:
            FORMULAS[p] = fn
        return fn
    return register


@formula(aten.mm)
def _mm(a, b, *_, **__) -> Expr:
    (m, k), (_, n) = shape(a), shape(b)
    return 2 * m * k * n


@formula(aten.addmm)
def _addmm(bias, a, b, *_, **__) -> Expr:  # the bias add is memory-bound, not counted
    return _mm(a, b)


@formula(aten.bmm)
def _bmm(a, b, *_, **__) -> Expr:
    (bs, m, k), (_, _, n) = shape(a), shape(b)
    return 2 * bs * m * k * n


@formula(aten.baddbmm)
def _baddbmm(bias, a, b, *_, **__) -> Expr:
    return _bmm(a, b)


def _conv(x, w, out, transposed: bool) -> Expr:
    """2 * batch * |weight| * (spatial positions the kernel is applied at)."""
    spatial = shape(x)[2:] if transposed else shape(out)[2:]
    return 2 * shape(x)[0] * prod(shape(w)) * prod(spatial)


@formula(aten.convolution, aten._convolution)
def _convolution(x, w, bias, stride, padding, dilation, transposed, *rest, out=None, **__) -> Expr:
    return _conv(x, w, out, bool(transposed))


@formula(aten.convolution_backward)
def _convolution_backward(grad_out, x, w, bias_sizes, stride, padding, dilation, transposed,
                          output_padding, groups, output_mask, out=None, **__) -> Expr:
    # Each requested gradient is one convolution of the forward's size: grad_input is the transposed
    # convolution of grad_out with w; grad_weight correlates x with grad_out. Bias grad is a reduction.
    fwd = _conv(x, w, grad_out, bool(transposed))
    return fwd * int(bool(output_mask[0])) + fwd * int(bool(output_mask[1]))


def _attention(q, k, v) -> Expr:
    """q: [b, h, s_q, d_q], k: [b, h, s_k, d_q], v: [b, h, s_k, d_v]: QK^T then PV."""
    b, h, s_q, d_q = shape(q)
    s_k, d_v = shape(k)[-2], shape(v)[-1]
    return 2 * b * h * s_q * s_k * (d_q + d_v)


_ATTENTION_FWD = (aten._scaled_dot_product_flash_attention, aten._scaled_dot_product_efficient_attention,
                  aten._scaled_dot_product_cudnn_attention, aten._scaled_dot_product_flash_attention_for_cpu)
_ATTENTION_BWD = (aten._scaled_dot_product_flash_attention_backward,
                  aten._scaled_dot_product_efficient_attention_backward,
                  aten._scaled_dot_product_cudnn_attention_backward,
                  aten._scaled_dot_product_flash_attention_for_cpu_backward)
# fused attention kernels: costed at the device's attention rate, not its matmul rate (cost/device.py)
ATTENTION = frozenset(_ATTENTION_FWD + _ATTENTION_BWD)


def is_attention(op: Any) -> bool:
    return getattr(op, "overloadpacket", None) in ATTENTION


def attention_per_key(op: Any, args: tuple) -> Expr:
    """A fused attention node's FLOPs per key position (its FLOPs over s_k): what a fixed cost per query
    tile adds for each key position's worth of it (cost/device.py: DeviceSpec.attention_key_overhead)."""
    q, k, v = (args[0], args[1], args[2]) if op.overloadpacket in _ATTENTION_FWD else (args[1], args[2], args[3])
    b, h, s_q, d_q = shape(q)
    per_key = 2 * b * h * s_q * (d_q + shape(v)[-1])
    return per_key if op.overloadpacket in _ATTENTION_FWD else 2 * per_key


def attention_dropout(op: Any, args: tuple, kwargs: dict) -> bool:
    """Whether a fused attention node applies dropout (its `dropout_p` argument, by the op's schema)."""
    for i, arg in enumerate(op._schema.arguments):
        if arg.name == "dropout_p":
            p = args[i] if i < len(args) else kwargs.get("dropout_p", arg.default_value)
            return isinstance(p, (int, float)) and p > 0
    return False


@formula(*_ATTENTION_FWD)
def _sdpa(q, k, v, *_, **__) -> Expr:
    return _attention(q, k, v)


@formula(*_ATTENTION_BWD)
def _sdpa_backward(grad_out, q, k, v, *_, **__) -> Expr:
    # dV = P^T dO and dP = dO V^T (the PV product twice), dQ = dS K and dK = dS^T Q (QK^T twice).
    return 2 * _attention(q, k, v)


# Ops that launch no kernel: the output aliases an input (no bytes moved, no memory).
_ALIASING_EXTRA = {aten._unsafe_view, aten.lift_fresh}

# Memory-bound ops that are not tagged pointwise: their cost is bytes moved, FLOPs count 0.
MEMORY_BOUND = {
    aten.sum, aten.mean, aten.amax, aten.amin, aten.max, aten.min, aten.var_mean, aten.var, aten.std,
    aten.prod, aten.argmax, aten.any, aten.all, aten.cumsum, aten.norm, aten.linalg_vector_norm,
    aten._softmax, aten._log_softmax, aten._safe_softmax, aten._softmax_backward_data,
    aten._log_softmax_backward_data, aten.native_layer_norm, aten.native_layer_norm_backward,
    aten.native_batch_norm, aten.native_batch_norm_backward, aten._native_batch_norm_legit_functional,
    aten._native_batch_norm_legit_no_training, aten.native_group_norm, aten.native_group_norm_backward,
    aten._fused_rms_norm, aten._fused_rms_norm_backward, aten.embedding, aten.embedding_dense_backward,
    aten.nll_loss_forward, aten.nll_loss_backward, aten.nll_loss2d_forward, aten.nll_loss2d_backward,
    aten.clone, aten._to_copy, aten.copy, aten.copy_, aten.cat, aten.stack, aten.full, aten.zeros,
    aten.ones, aten.empty, aten.empty_like, aten.zeros_like, aten.ones_like, aten.full_like,
    aten.empty_strided, aten.new_zeros, aten.new_empty, aten.new_ones, aten.scalar_tensor, aten.arange,
    aten.gather, aten.scatter, aten.scatter_add, aten.index, aten.index_put, aten.index_select,
    aten.index_add, aten.slice_scatter, aten.select_scatter, aten.select_backward, aten.slice_backward,
    aten.constant_pad_nd, aten.max_pool2d_with_indices, aten.max_pool2d_with_indices_backward,
    aten.avg_pool2d, aten.avg_pool2d_backward, aten._adaptive_avg_pool2d, aten._adaptive_avg_pool2d_backward,
    aten.native_dropout, aten.native_dropout_backward, aten.tril, aten.triu, aten.masked_fill,
    aten.repeat, aten.sort, aten.topk, aten.rand, aten.randn, aten.bernoulli, aten.one_hot, aten.flip,
    aten.roll, aten.cumprod, aten.logsumexp, aten.threshold_backward, aten.gelu_backward,
    aten.silu_backward, aten.tanh_backward, aten.sigmoid_backward, aten.where, aten.masked_fill_,
    aten.fill, aten.fill_, aten.zero_, aten.fmod, aten.remainder, aten.expand_copy, aten.view_copy,
    aten.permute_copy, aten.split_with_sizes_copy, aten.alias_copy, aten.diagonal_copy,
}

KINDS = ("matmul", "memory", "view", "comm", "unknown")
# functional collectives (and their waits) in a graph: communication, not compute; timed by their bytes in
# the single-device cost model (the parallel plan costs them with the interconnect model, parallel/comm.py)
COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d_functional", "_c10d_functional_autograd")


def is_aliasing(op: Any) -> bool:
    """True if the op returns a view of an input (schema alias annotation, not an in-place write)."""
    if not isinstance(op, torch._ops.OpOverload):
        return False
    if op.overloadpacket in _ALIASING_EXTRA:
        return True
    returns = op._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def classify(op: Any, makes_tensor: bool = True) -> str:
    """'matmul' (has a FLOP formula), 'memory' (bytes-bound), 'view' (no kernel), 'comm' (a functional
    collective or its wait) or 'unknown'.

    Python-level nodes (getitem, SymInt arithmetic such as operator.mul) launch nothing unless they
    produce a tensor, which only an op we do not know would do."""
    if not isinstance(op, torch._ops.OpOverload):
        return "view" if getattr(op, "__name__", "") == "getitem" or not makes_tensor else "unknown"
    packet = op.overloadpacket
    if op.namespace in COLLECTIVE_NAMESPACES:
        return "comm"
    if packet in FORMULAS:
        return "matmul"
    if is_aliasing(op):
        return "view"
    if packet in MEMORY_BOUND or torch.Tag.pointwise in op.tags:
        return "memory"
    return "unknown"


def flops(op: Any, args: tuple, kwargs: dict, out: Any) -> Expr:
    fn = FORMULAS.get(getattr(op, "overloadpacket", None))
    return ZERO if fn is None else fn(*args, out=out, **kwargs)


def _register_missing_in_flop_counter() -> None:
    """FlopCounterMode has no formula for CPU flash attention; give it ours so eager counts compare."""
    from .. import _torch_compat as compat

    for op, fn in ((aten._scaled_dot_product_flash_attention_for_cpu, _sdpa),
                   (aten._scaled_dot_product_flash_attention_for_cpu_backward, _sdpa_backward)):
        compat.register_flop_formula(op, lambda *a, _fn=fn, out_val=None, **k: int(_fn(*a, **k)))


_register_missing_in_flop_counter()
