"""Hand-written cross-entropy kernels (triton_kernels.cross_entropy) against F.cross_entropy and aten's
decomposition (_log_softmax + nll_loss_forward, nll_loss_backward + _log_softmax_backward_data).

Without a GPU the kernels run in Triton's interpreter (conftest sets TRITON_INTERPRET=1). Shapes are
small and blocks forced small, so rows take several chunks and V is not a multiple of the block.
"""
import os

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton", reason="triton is not importable: no kernel can run")

import torch.nn.functional as F  # noqa: E402

from triton_kernels import NotFusible  # noqa: E402
from triton_kernels.cross_entropy import (cross_entropy, cross_entropy_backward,  # noqa: E402
                                          cross_entropy_forward, valid_count)

pytestmark = pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning", "ignore:invalid value:RuntimeWarning",
                                        "ignore:divide by zero:RuntimeWarning")
aten = torch.ops.aten
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# the reference runs in fp64 on the same (rounded) logits; the kernels compute in fp32 and round only
# the gradient to the logits' dtype (a bf16 store truncates under the interpreter: one more ulp)
LOSS_TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=1e-5, rtol=1e-5),
            torch.float16: dict(atol=1e-5, rtol=1e-5)}
GRAD_TOL = {torch.float32: dict(atol=1e-8, rtol=1e-5), torch.bfloat16: dict(atol=1e-7, rtol=1.6e-2),
            torch.float16: dict(atol=6e-8, rtol=2e-3)}   # fp16 subnormals: 6e-8 apart
BLOCK = 256


@pytest.fixture(autouse=True)
def kernel_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("COLAUTO_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kernels"))


def make(n, v, dtype, *, ignored=(), ignore_index=-100, scale=3.0, width=None):
    """Logits [n, v] (a column slice of a wider [n, width] tensor when width is given) and targets."""
    full = (torch.randn(n, width or v, device=DEVICE) * scale).to(dtype)
    logits = full[:, 3:3 + v] if width else full
    target = torch.randint(0, v, (n,), device=DEVICE)
    target[list(ignored)] = ignore_index
    return logits, target


def reference(logits, target, ignore_index=-100):
    """F.cross_entropy's loss and logits gradient in fp64 (the exact answer for these rounded logits)."""
    x = logits.detach().double().requires_grad_()
    loss = F.cross_entropy(x, target, ignore_index=ignore_index)
    loss.backward()
    return loss.detach(), x.grad


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_f_cross_entropy(dtype):
    """Forward loss and autograd gradient, N and V not multiples of the block, ignored rows present,
    rows that take 4 chunks with a partial last one."""
    logits, target = make(37, 1000, dtype, ignored=(0, 5, 36))
    want_loss, want_grad = reference(logits, target)
    x = logits.clone().requires_grad_()
    loss = cross_entropy(x, target, block=BLOCK)
    assert loss.dtype == torch.float32 and loss.shape == ()
    torch.testing.assert_close(loss.double(), want_loss, **LOSS_TOL[dtype])
    loss.backward()
    assert x.grad.dtype == dtype and x.grad.shape == logits.shape
    torch.testing.assert_close(x.grad.double(), want_grad, **GRAD_TOL[dtype])
    assert (x.grad[[0, 5, 36]] == 0).all()
    # and against eager F.cross_entropy in the logits' own dtype, as training would run it
    y = logits.clone().requires_grad_()
    eager = F.cross_entropy(y, target)
    eager.backward()
    tol = dict(atol=2e-2, rtol=2e-2) if dtype != torch.float32 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss, eager.float(), **tol)
    torch.testing.assert_close(x.grad.float(), y.grad.float(), atol=tol["atol"] / 100, rtol=tol["rtol"])


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_aten_decomposition(dtype):
    """The functional API against the aten pair the fusion pass replaces, with aten's total_weight fed to
    the backward and a grad_loss other than 1; a non-default ignore_index inside [0, V)."""
    ignore = 7
    logits, target = make(19, 1531, dtype, ignored=(2, 3, 11), ignore_index=ignore)
    logp = aten._log_softmax(logits, 1, False)
    out, total_weight = aten.nll_loss_forward(logp, target, None, 1, ignore)
    grad_out = torch.tensor(0.37, device=DEVICE).to(dtype)
    g = aten.nll_loss_backward(grad_out, logp, target, None, 1, ignore, total_weight)
    want_grad = aten._log_softmax_backward_data(g, logp, 1, dtype)

    loss, lse = cross_entropy_forward(logits, target, ignore, block=BLOCK)
    assert lse.dtype == torch.float32 and lse.shape == (19,)
    torch.testing.assert_close(lse, torch.logsumexp(logits.double(), 1).float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(total_weight.float(), valid_count(target, ignore))
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=1e-2)
    torch.testing.assert_close(loss, out.float(), **tol)
    grad = cross_entropy_backward(grad_out, logits, target, lse, ignore, total_weight=total_weight, block=BLOCK)
    assert grad.dtype == dtype and grad.shape == logits.shape and grad.is_contiguous()
    gtol = dict(atol=1e-8, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-5, rtol=3e-2)
    torch.testing.assert_close(grad.float(), want_grad.float(), **gtol)
    assert (grad[[2, 3, 11]] == 0).all()
    # the default count equals aten's total_weight
    torch.testing.assert_close(cross_entropy_backward(grad_out, logits, target, lse, ignore, block=BLOCK), grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_non_contiguous_rows(dtype):
    """A column slice of a wider tensor: rows read through their stride, no copy; default block (one
    chunk of next_pow2(V)) and a forced small one give the same answer."""
    logits, target = make(23, 2999, dtype, ignored=(4,), width=3100)
    assert not logits.is_contiguous() and logits.stride() == (3100, 1)
    want_loss, want_grad = reference(logits, target)
    for block in (BLOCK, None):
        x = logits.detach().requires_grad_()
        loss = cross_entropy(x, target, block=block)
        loss.backward()
        torch.testing.assert_close(loss.double(), want_loss, **LOSS_TOL[dtype])
        torch.testing.assert_close(x.grad.double(), want_grad, **GRAD_TOL[dtype])


def test_strided_columns_are_copied():
    """A transposed (column-strided) view goes through a contiguous copy and still matches."""
    base = torch.randn(1100, 13, device=DEVICE)
    logits, target = base.t(), torch.randint(0, 1100, (13,), device=DEVICE)
    want_loss, want_grad = reference(logits, target)
    loss, lse = cross_entropy_forward(logits, target, block=BLOCK)
    torch.testing.assert_close(loss.double(), want_loss, atol=1e-5, rtol=1e-5)
    grad = cross_entropy_backward(torch.tensor(1.0, device=DEVICE), logits, target, lse, block=BLOCK)
    torch.testing.assert_close(grad.double(), want_grad, atol=1e-8, rtol=1e-5)


def test_all_ignored_gives_nan_loss_and_zero_grad():
    """aten: 0/0 = nan loss, and nll_loss_backward leaves the gradient zero."""
    logits, target = make(5, 1000, torch.float32, ignored=range(5))
    logp = aten._log_softmax(logits, 1, False)
    out, total_weight = aten.nll_loss_forward(logp, target, None, 1, -100)
    want_grad = aten._log_softmax_backward_data(
        aten.nll_loss_backward(torch.tensor(1.0, device=DEVICE), logp, target, None, 1, -100, total_weight),
        logp, 1, torch.float32)
    loss, lse = cross_entropy_forward(logits, target, block=BLOCK)
    assert out.isnan() and loss.isnan()
    grad = cross_entropy_backward(torch.tensor(1.0, device=DEVICE), logits, target, lse, block=BLOCK)
    assert (want_grad == 0).all() and (grad == 0).all()


def test_extreme_logits():
    """-inf logits (masked vocabulary entries) and large magnitudes: no overflow, no nan from -inf - -inf
    in a chunk that is entirely -inf. (The gradient's relative error is about |lse| * 2^-24, from lse's
    rounding to fp32: fine for logits in the hundreds, not for an offset of 1e4.)"""
    logits, target = make(6, 1100, torch.float32, scale=1.0)
    logits[:, :600] = float("-inf")              # the first chunks of every row are all -inf
    logits[1] *= 1e4                             # huge spread
    logits[2] += 100                             # large offset: p = exp(x - lse) is exact to ulp(lse)
    target = torch.randint(600, 1100, (6,), device=DEVICE)
    want_loss, want_grad = reference(logits, target)
    x = logits.clone().requires_grad_()
    loss = cross_entropy(x, target, block=BLOCK)
    loss.backward()
    torch.testing.assert_close(loss.double(), want_loss, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(x.grad.double(), want_grad, atol=1e-7, rtol=1e-5)
    assert (x.grad[:, :600] == 0).all()


def test_out_of_range_target_gives_nan():
    """aten raises on a target outside [0, V); the kernel signals it with nan rather than a host sync."""
    logits, target = make(4, 1000, torch.float32)
    target[1] = 1000
    loss, lse = cross_entropy_forward(logits, target, block=BLOCK)
    assert loss.isnan()
    grad = cross_entropy_backward(torch.tensor(1.0, device=DEVICE), logits, target, lse, block=BLOCK)
    assert grad[1].isnan().all() and not grad[[0, 2, 3]].isnan().any()


def test_unsupported_arguments_are_refused():
    logits, target = make(4, 100, torch.float32)
    with pytest.raises(NotFusible, match="weights"):
        cross_entropy(logits, target, weight=torch.ones(100, device=DEVICE))
    for reduction in ("sum", "none", 0, 2):
        with pytest.raises(NotFusible, match="reduction"):
            cross_entropy(logits, target, reduction=reduction)
    with pytest.raises(NotFusible, match="label_smoothing"):
        cross_entropy(logits, target, label_smoothing=0.1)
    with pytest.raises(NotFusible, match="dtype"):
        cross_entropy_forward(logits.double(), target)
    with pytest.raises(NotFusible, match=r"\[N, V\]"):
        cross_entropy_forward(logits.reshape(2, 2, 100), target)
    with pytest.raises(NotFusible, match="target"):
        cross_entropy_forward(logits, target.float())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["rows_start_off_vector", "base_off_vector"])
def test_rows_that_do_not_start_on_a_vector(dtype, layout):
    """V = 1003: most rows start mid-vector; and a contiguous tensor whose own address is off a
    16-byte boundary. Both against the fp64 reference."""
    n, v = 29, 1003
    flat = (torch.randn(n * v + 1, device=DEVICE) * 3.0).to(dtype)
    logits = flat[:n * v].view(n, v) if layout == "rows_start_off_vector" else flat[1:].view(n, v)
    assert logits.is_contiguous() and (logits.data_ptr() % 16 == 0) == (layout == "rows_start_off_vector")
    target = torch.randint(0, v, (n,), device=DEVICE)
    target[3] = -100
    want_loss, want_grad = reference(logits, target)
    x = logits.clone() if layout == "rows_start_off_vector" else logits
    x = x.detach().requires_grad_()
    loss = cross_entropy(x, target, block=BLOCK)
    loss.backward()
    torch.testing.assert_close(loss.double(), want_loss, **LOSS_TOL[dtype])
    torch.testing.assert_close(x.grad.double(), want_grad, **GRAD_TOL[dtype])
