"""Hand-written cross-entropy for large vocabularies (issue 4 of 4): aten's
`_log_softmax` + `nll_loss_forward` and `nll_loss_backward` + `_log_softmax_backward_data` pairs,
without materializing the [N, V] log-probabilities or a separate [N, V] probability tensor.

Forward: one program per ROWS rows (one where rows are long) walks them in BLOCK-column chunks with an
online max and sum (logsumexp in one pass, each logit read once), then loads the target's logit:
    lse_i = logsumexp(logits[i]),  loss_i = lse_i - logits[i, target_i]   (0 for ignored rows)
    loss  = sum(loss_i) / count,   count = number of rows whose target != ignore_index
Backward: one program per ROWS rows and BLOCK columns, each gradient element read and written once:
    grad[i, j] = (exp(logits[i, j] - lse_i) - [j == target_i]) * grad_loss / count   (0 for ignored rows)

Semantics are aten's for weight=None, reduction='mean', label_smoothing=0, 2-D logits [N, V] with
class dim 1: all rows ignored gives a nan loss (0/0) and an all-zero gradient; a row whose target is
neither ignore_index nor in [0, V) (aten raises) gives a nan loss and a nan gradient row, not an error,
so no host sync is needed. Everything is computed in fp32; the loss and lse are fp32, the gradient has
the logits' dtype and is contiguous. Logits may be fp32, bf16 or fp16 with any row stride; a column
stride other than 1 costs a contiguous copy. Anything else (class weights, reduction 'sum'/'none',
label smoothing, other ranks or dtypes) raises `NotFusible` from `check`, which the fusion pass
calls before it replaces a pattern; the functions below call it too.

The kernels' sources are fixed strings loaded through `cache.kernel`, so Triton is imported only at the
first launch (after `_triton` set TRITON_INTERPRET=1 where there is no GPU) and COLAUTO_PRINT_KERNELS=1
prints them like the generated ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import _triton, cache
from .ir import NotFusible
from .tuning import next_pow2

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TARGET_DTYPES = (torch.int64, torch.int32)
MAX_BLOCK = 4096           # columns per chunk on CUDA: 13 chunks for V=50257
MAX_ROWS = 16              # rows per program where rows are short (tile rows x block <= MAX_BLOCK)
_REDUCTIONS = {1: "mean", 0: "none", 2: "sum"}    # aten's reduction enum (torch.nn._reduction)


_FORWARD = '''
@triton.jit
def kernel(logits_ptr, target_ptr, loss_ptr, lse_ptr, n_rows, n_cols, row_stride, ignore_index,
           BLOCK: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    src = logits_ptr + rows[:, None] * row_stride
    cols = tl.arange(0, BLOCK)
    # online logsumexp per row: running max m and sum s of exp(x - m), rescaled when m grows; a chunk of
    # all -inf (or the start) keeps the shift at 0 so that no -inf - -inf appears
    m = tl.full([ROWS], float("-inf"), tl.float32)
    s = tl.zeros([ROWS], tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        x = tl.load(src + offs[None, :], mask=row_ok[:, None] & (offs[None, :] < n_cols),
                    other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - shift) + tl.sum(tl.exp(x - shift[:, None]), axis=1)
        m = m_new
    lse = m + tl.log(s)
    target = tl.load(target_ptr + rows, mask=row_ok, other=ignore_index).to(tl.int64)
    valid = target != ignore_index
    in_range = (target >= 0) & (target < n_cols)
    x_target = tl.load(logits_ptr + rows * row_stride + target, mask=row_ok & valid & in_range,
                       other=0.0).to(tl.float32)
    loss = tl.where(valid, tl.where(in_range, lse - x_target, float("nan")), 0.0)
    tl.store(loss_ptr + rows, loss, mask=row_ok)
    tl.store(lse_ptr + rows, lse, mask=row_ok)
'''

_BACKWARD = '''
@triton.jit
def kernel(logits_ptr, target_ptr, lse_ptr, grad_loss_ptr, count_ptr, grad_ptr, n_rows, n_cols, row_stride,
           ignore_index, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    # one program per (ROWS rows, BLOCK columns): no loop, so every program's loads are independent
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_row = offs < n_cols
    target = tl.load(target_ptr + rows, mask=row_ok, other=ignore_index).to(tl.int64)
    valid = target != ignore_index
    in_range = (target >= 0) & (target < n_cols)
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    scale = tl.load(grad_loss_ptr).to(tl.float32) / tl.load(count_ptr).to(tl.float32)
    scale = tl.where(in_range, scale, float("nan"))
    n_read = tl.where(valid, n_cols, 0)     # ignored rows (and rows past the end) read nothing
    x = tl.load(logits_ptr + rows[:, None] * row_stride + offs[None, :], mask=offs[None, :] < n_read[:, None],
                other=0.0).to(tl.float32)
    g = (tl.exp(x - lse[:, None]) - tl.where(offs[None, :] == target[:, None], 1.0, 0.0)) * scale[:, None]
    g = tl.where(valid[:, None], g, 0.0)        # ignored rows: 0 even where lse or scale is not finite
    tl.store(grad_ptr + rows[:, None] * n_cols + offs[None, :], g.to(grad_ptr.dtype.element_ty),
             mask=row_ok[:, None] & in_row[None, :])
'''


@dataclass(frozen=True)
class CrossEntropySpec:
    """The cache key of one of the two fixed kernels (block sizes are launch-time constants)."""
    kind: str           # "forward" or "backward"
    version: int = 3


def _emit(spec: CrossEntropySpec) -> str:
    return {"forward": _FORWARD, "backward": _BACKWARD}[spec.kind].lstrip("\n")


def check(logits, target, *, weight=None, reduction="mean", label_smoothing: float = 0.0) -> None:
    """Raise `NotFusible` (a ValueError, one line) unless these kernels compute this cross-entropy.
    `reduction` is a string or aten's enum (0 none, 1 mean, 2 sum). Works on fake and meta tensors."""
    reduction = _REDUCTIONS.get(reduction, reduction)
    if weight is not None:
        raise NotFusible("cross_entropy with class weights is not supported by the Triton kernel")
    if reduction != "mean":
        raise NotFusible(f"cross_entropy with reduction={reduction!r} is not supported (only 'mean')")
    if label_smoothing:
        raise NotFusible(f"cross_entropy with label_smoothing={label_smoothing} is not supported")
    if logits.dim() != 2 or logits.shape[1] == 0:
        raise NotFusible(f"cross_entropy needs logits [N, V] with V > 0, got shape {tuple(logits.shape)}")
    if logits.dtype not in DTYPES:
        raise NotFusible(f"cross_entropy logits of dtype {logits.dtype} are not supported")
    if target.dtype not in TARGET_DTYPES or tuple(target.shape) != (logits.shape[0],):
        raise NotFusible(f"cross_entropy needs an int64 target [{logits.shape[0]}], "
                         f"got {target.dtype} {tuple(target.shape)}")
    if target.device != logits.device:
        raise NotFusible(f"cross_entropy logits on {logits.device} and target on {target.device}")


def _kernel(kind: str):
    ok = _triton.availability()
    if not ok:
        raise RuntimeError(f"Triton kernels are unavailable: {ok.reason}")
    return cache.kernel(CrossEntropySpec(kind), _emit)


def _launch_config(n_cols: int, block: int | None) -> tuple[int, int, int]:
    """(columns per chunk, rows per program, warps). Short rows share a program: a tile of up to
    MAX_BLOCK elements (large vocabularies get one row per program, as before)."""
    block = block or min(next_pow2(n_cols), MAX_BLOCK)
    if block & (block - 1):
        raise ValueError(f"block={block} is not a power of two")
    rows = max(1, min(MAX_ROWS, MAX_BLOCK // block))
    return block, rows, 8 if block * rows >= 2048 else 4


def _rows(logits: torch.Tensor) -> torch.Tensor:
    """Logits whose columns are contiguous; rows may have any stride (a slice of a wider tensor)."""
    return logits if logits.stride(1) == 1 or logits.shape[1] == 1 else logits.contiguous()


def valid_count(target: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """The number of non-ignored rows as a 0-dim fp32 tensor: aten's `total_weight` for weight=None."""
    return (target != ignore_index).sum(dtype=torch.float32)


def cross_entropy_forward(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, *,
                          block: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, lse): the mean cross-entropy over non-ignored rows (0-dim fp32; nan if every row is
    ignored) and each row's logsumexp ([N] fp32, for `cross_entropy_backward`). `block` overrides the
    columns per chunk (a power of two; tests use small ones so that rows take several chunks)."""
    check(logits, target)
    logits = _rows(logits)
    n_rows, n_cols = logits.shape
    losses = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    lse = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    if n_rows:
        block, rows, warps = _launch_config(n_cols, block)
        _kernel("forward")[(-(-n_rows // rows),)](logits, target.contiguous(), losses, lse, n_rows, n_cols,
                                                  logits.stride(0), ignore_index, BLOCK=block, ROWS=rows,
                                                  num_warps=warps)
    return losses.sum() / valid_count(target, ignore_index), lse


def cross_entropy_backward(grad_loss: torch.Tensor, logits: torch.Tensor, target: torch.Tensor,
                           lse: torch.Tensor, ignore_index: int = -100, *, total_weight: torch.Tensor | None = None,
                           block: int | None = None) -> torch.Tensor:
    """The gradient of the mean loss for logits: [N, V], contiguous, in the logits' dtype.
    `grad_loss` is the loss's 0-dim gradient (any float dtype, read on the device: no sync).
    `total_weight` is the count of non-ignored rows (aten's nll_loss_forward second output, any float
    dtype); by default it is recomputed from target."""
    check(logits, target)
    logits = _rows(logits)
    n_rows, n_cols = logits.shape
    if tuple(lse.shape) != (n_rows,) or lse.dtype != torch.float32:
        raise ValueError(f"lse must be fp32 [{n_rows}], got {lse.dtype} {tuple(lse.shape)}")
    count = valid_count(target, ignore_index) if total_weight is None else total_weight
    grad = torch.empty((n_rows, n_cols), dtype=logits.dtype, device=logits.device)
    if n_rows:
        block, rows, warps = _launch_config(n_cols, block)
        grad_loss = torch.as_tensor(grad_loss, device=logits.device).reshape(())
        _kernel("backward")[(-(-n_rows // rows), -(-n_cols // block))](
            logits, target.contiguous(), lse.contiguous(), grad_loss, count.reshape(()), grad, n_rows, n_cols,
            logits.stride(0), ignore_index, BLOCK=block, ROWS=rows, num_warps=warps)
    return grad


class CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, ignore_index, block):
        loss, lse = cross_entropy_forward(logits, target, ignore_index, block=block)
        ctx.save_for_backward(logits, target, lse)
        ctx.ignore_index, ctx.block = ignore_index, block
        ctx.mark_non_differentiable(lse)
        return loss, lse

    @staticmethod
    def backward(ctx, grad_loss, _grad_lse):
        logits, target, lse = ctx.saved_tensors
        grad = cross_entropy_backward(grad_loss, logits, target, lse, ctx.ignore_index, block=ctx.block)
        return grad, None, None, None


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, *, weight=None,
                  reduction: str = "mean", label_smoothing: float = 0.0, block: int | None = None) -> torch.Tensor:
    """Differentiable `F.cross_entropy(logits, target, ignore_index=...)` for 2-D logits; the loss is
    fp32. Unsupported arguments (weight, reduction other than 'mean', label_smoothing) raise NotFusible."""
    check(logits, target, weight=weight, reduction=reduction, label_smoothing=label_smoothing)
    return CrossEntropy.apply(logits, target, ignore_index, block)[0]
