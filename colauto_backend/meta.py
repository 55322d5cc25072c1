"""Planning a model that lives on the meta device (no weights allocated) as a GPU would run it.

Capture reads shapes and dtypes only, so a model built under `torch.device("meta")` with meta inputs
is captured like a real one, with one difference: on the meta device
`scaled_dot_product_attention` takes its math path (the whole attention matrix materialized, softmax
saved for backward), while on a GPU it runs the fused flash (bf16/fp16) or memory-efficient kernel,
which keeps O(sequence) memory. `gpu_attention()` makes meta tensors take the fused kernels for the
duration of a capture, choosing as the CUDA dispatcher does for the common cases (flash for half
precision without a mask, grouped k/v heads as they are; memory-efficient otherwise).

It also restores `nll_loss`'s backward on meta. Under AOTAutograd's trace (the Python dispatcher), the
meta kernel torch registers for `aten.nll_loss` from its reference decomposition takes the op's
AutogradMeta slot from its CompositeImplicitAutograd kernel, so autograd sees no derivative: it warns,
and the joint graph had no `nll_loss_backward` or `_log_softmax_backward_data` (the loss's gradient
over the whole logits, the largest tensor of a language model's backward), or, for this project's
GPT-2, lost the last layer's gradients. `nll_loss` runs its composite kernel instead, as on a GPU:
`nll_loss_forward` (2-D) or `nll_loss2d_forward`, each with its derivative.
"""
from __future__ import annotations

import contextlib

import torch

aten = torch.ops.aten


def on_meta(*tensors) -> bool:
    return any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in tensors)


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    flash = attn_mask is None and q.dtype in (torch.float16, torch.bfloat16) and q.size(-1) <= 256
    if k.size(-3) != q.size(-3) and not flash:        # grouped k/v heads: flash takes them as they are
        repeat = q.size(-3) // k.size(-3)
        k, v = k.repeat_interleave(repeat, -3), v.repeat_interleave(repeat, -3)
    if flash:
        return aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, scale=scale)[0]
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill(~attn_mask, float("-inf"))
    return aten._scaled_dot_product_efficient_attention(q, k, v, attn_mask, True, dropout_p, is_causal,
                                                        scale=scale)[0]


def _nll_loss(*args, **kwargs):
    return aten.nll_loss.default.decompose(*args, **kwargs)   # the CompositeImplicitAutograd kernel


@contextlib.contextmanager
def gpu_attention(active: bool = True):
    """While active, scaled_dot_product_attention on meta tensors runs the fused GPU kernels' ops, and
    nll_loss its composite kernel (module docstring)."""
    if not active:
        yield
        return
    lib = torch.library.Library("aten", "IMPL")
    try:
        lib.impl("scaled_dot_product_attention", _sdpa, "AutogradMeta")
        lib.impl("nll_loss", _nll_loss, "AutogradMeta")
        yield
    finally:
        lib._destroy()
