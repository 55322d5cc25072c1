"""Generated Triton kernels (triton_kernels) against eager aten running the same FX graph.

Without a GPU the kernels run in Triton's interpreter. Triton reads TRITON_INTERPRET when @triton.jit
decorates a kernel (3.4+; earlier releases at import), so it is set here before triton is imported.
With CUDA the same tests run compiled kernels. Shapes are tiny and blocks small, so that sizes are not
multiples of the block and several programs run.
"""
import json
import os
import subprocess
import sys
import textwrap

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton", reason="triton is not importable: no generated kernel can run")

import torch.nn.functional as F  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

import triton_kernels as tk  # noqa: E402
from triton_kernels import layout  # noqa: E402

# masked-off lanes compute on padding (log(0), 1/0) in the interpreter's numpy; their results are never stored
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
aten = torch.ops.aten
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# eager rounds every op to the dtype, a fused kernel only its outputs; under the interpreter a bf16
# store truncates (compiled Triton rounds to nearest even): one more bf16 ulp
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
       torch.float16: dict(atol=2e-3, rtol=2e-3)}
SMALL = tk.Tuning(block=64, persistent_cols=16, loop_cols=16, row_tile=64)   # rows over 16 columns loop


@pytest.fixture(autouse=True)
def kernel_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("COLAUTO_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kernels"))


def rand(*shape, dtype=torch.float32):
    return torch.randn(shape, device=DEVICE).to(dtype)


def check(fn, *inputs, dtype=torch.float32, tuning=SMALL):
    """Compile fn's aten graph into one kernel; its outputs must match the same graph run eagerly,
    in value, dtype, shape and strides."""
    gm = make_fx(fn)(*inputs)
    region = tk.compile_region(gm.graph, inputs, tuning=tuning)
    got = region(*inputs)
    want = gm(*inputs)
    want = tuple(want) if isinstance(want, (tuple, list)) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g.dtype, g.shape, g.stride()) == (w.dtype, w.shape, w.stride())
        torch.testing.assert_close(g, w, equal_nan=True, **(TOL[dtype] if w.is_floating_point() else {}))
    return region


# ---- pointwise ----------------------------------------------------------------------------------

POSITIVE = {"log", "sqrt", "rsqrt", "pow_half", "pow_minus_half", "pow_2_5"}
UNARY = {
    "neg": torch.neg, "exp": torch.exp, "log": torch.log, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "abs": torch.abs, "reciprocal": torch.reciprocal,
    "erf": torch.erf, "relu": torch.relu, "gelu": lambda x: F.gelu(x),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": lambda x: F.silu(x), "pow_2": lambda x: x.pow(2), "pow_3": lambda x: x.pow(3), "pow_7": lambda x: x.pow(7),
    "pow_11": lambda x: x.pow(11), "pow_0": lambda x: x.pow(0), "pow_minus_1": lambda x: x.pow(-1),
    "pow_minus_2": lambda x: x.pow(-2), "pow_half": lambda x: x.pow(0.5), "pow_minus_half": lambda x: x.pow(-0.5),
    "pow_2_5": lambda x: x.pow(2.5), "clamp": lambda x: x.clamp(-0.5, 0.7), "clamp_min": lambda x: x.clamp(min=0.1),
    "scalars": lambda x: (1.5 - x) * 0.25 + 3 - x / 7,
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", UNARY)
def test_unary(op, dtype):
    x = rand(5, 37, dtype=dtype)
    if op in POSITIVE:
        x = x.abs() + 0.25
    if op.startswith("pow_") and not op.startswith("pow_minus") or op == "reciprocal":
        x = x.clamp(-1.5, 1.5)          # keep x^11 and 1/x within half-precision range and tolerance
    if op in ("reciprocal", "pow_minus_1", "pow_minus_2"):
        x = torch.where(x.abs() < 0.25, torch.full_like(x, 0.5), x)
    check(UNARY[op], x, dtype=dtype)


BINARY = {
    "add_sub_alpha": lambda x, y: torch.add(x, y, alpha=2) - torch.sub(y, x, alpha=0.5),
    "mul_div": lambda x, y: x * y / (y.abs() + 1),
    "maximum_minimum": lambda x, y: torch.maximum(x, y) + torch.minimum(x, 2 * y),
    "clamp_tensor": lambda x, y: torch.clamp(x, min=y - 1, max=y + 1),
    "where": lambda x, y: torch.where(x > y, x, y * 2),
    "where_scalar": lambda x, y: torch.where(x <= 0.3, 0.0, y),
    "comparisons": lambda x, y: ((x < y) & (x >= -0.5)) | (x == y) ^ ~(x != 0.25) | torch.logical_not(x > 1),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", BINARY)
def test_binary(op, dtype):
    check(BINARY[op], rand(5, 37, dtype=dtype), rand(5, 37, dtype=dtype), dtype=dtype)


BACKWARD = {
    "gelu_backward": lambda g, x: aten.gelu_backward(g, x),
    "gelu_backward_tanh": lambda g, x: aten.gelu_backward(g, x, approximate="tanh"),
    "silu_backward": lambda g, x: aten.silu_backward(g, x),
    "sigmoid_backward": lambda g, x: aten.sigmoid_backward(g, torch.sigmoid(x)),
    "tanh_backward": lambda g, x: aten.tanh_backward(g, torch.tanh(x)),
    "threshold_backward": lambda g, x: aten.threshold_backward(g, torch.relu(x), 0),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", BACKWARD)
def test_backward_ops(op, dtype):
    check(BACKWARD[op], rand(5, 37, dtype=dtype), rand(5, 37, dtype=dtype), dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_casts_round_where_eager_does(dtype):
    """An explicit cast to a half type rounds mid-region; computing in fp32 around it."""
    def fn(x, i, m):
        y = (x.float() * 3.1).to(dtype)
        return y.float() + i.to(torch.float32) * 0.5, torch.where(m, y, 0.0), (x > 0).to(torch.int32)
    x = rand(5, 37, dtype=dtype)
    i = torch.randint(-5, 5, (5, 37), device=DEVICE)
    check(fn, x, i, rand(5, 37) > 0, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_explicit_cast_rounds_mid_region(dtype):
    """x.to(half).float() inside a region rounds as eager does, though the kernel computes in fp32. Exact,
    except that the interpreter truncates fp32 -> bf16 where compiled Triton rounds to nearest even."""
    x = rand(5, 37) * 3
    gm = make_fx(lambda x: x.to(dtype).to(torch.float32) * 2)(x)
    got, want = tk.compile_region(gm.graph, [x], tuning=SMALL)(x)[0], gm(x)
    exact = dtype == torch.float16 or DEVICE == "cuda"
    assert ((got - want).abs() <= (0 if exact else torch.finfo(dtype).eps * want.abs())).all()
    assert (got != x * 2).any()


def test_nan_propagates_like_eager():
    x = rand(4, 19)
    x[0, :5] = float("nan")
    check(lambda x: (torch.maximum(x, 0.5 * x), x.clamp(-0.5, 0.5), torch.relu(x), x.amax(-1)), x)


def test_outputs_share_intermediates():
    check(lambda x, y: ((x + y).exp(), (x + y).exp() * y, torch.sigmoid(x)), rand(3, 50), rand(3, 50))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shapes", [
    [(6, 37), (37,)], [(6, 1), (1, 37)], [(2, 5, 13), (5, 13), (2, 1, 1)], [(6, 37), ()]], ids=str)
def test_broadcast_inputs(shapes, dtype):
    inputs = [rand(*s, dtype=dtype) for s in shapes]
    check(lambda *xs: sum(xs[1:], xs[0]) * xs[-1] + 1, *inputs, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout_", ["transposed", "sliced", "expanded", "permuted"])
def test_noncontiguous_inputs(layout_, dtype):
    """Read in place by strides; outputs take eager's strides (a transposed input gives a transposed
    output) and the walk follows the output's memory order."""
    x = {"transposed": lambda: rand(37, 6, dtype=dtype).t(),
         "sliced": lambda: rand(6, 80, dtype=dtype)[1:, 3:77:2],
         "expanded": lambda: rand(6, 1, dtype=dtype).expand(6, 37),
         "permuted": lambda: rand(3, 7, 5, dtype=dtype).permute(2, 0, 1)}[layout_]()
    y = rand(*x.shape, dtype=dtype)
    check(lambda x, y: (F.gelu(x) * y, x - 1), x, y, dtype=dtype)


def test_one_kernel_serves_every_size_with_the_same_pattern():
    gm = make_fx(lambda x, b: x * b + 0.125)(rand(4, 8), rand(8))
    region = tk.compile_region(gm.graph, [rand(4, 8), rand(8)], tuning=SMALL)
    before = tk.cache_stats()
    for n, d in [(3, 100), (7, 33)]:
        x, b = rand(n, d), rand(d)
        torch.testing.assert_close(region(x, b)[0], gm(x, b))
    assert tk.cache_stats()["misses"] == before["misses"]


def test_int64_indexing(monkeypatch):
    """Offsets past 2**31 switch the kernel to int64 indices (the limit is lowered to exercise it)."""
    monkeypatch.setattr(layout, "INDEX32_LIMIT", 100)
    x, y = rand(37, 5).t(), rand(37)
    region = check(lambda x, y: x * y, x, y)
    assert region.launch_for([x, y]).spec.int64
    check(lambda x: torch.softmax(x, -1), rand(5, 37))


# ---- rows: last-dim reductions ----------------------------------------------------------------------

ROW_TUNINGS = {"persistent": tk.Tuning(row_tile=64), "looped": SMALL}


def layer_norm(x, w, b):
    return aten.native_layer_norm(x, [x.shape[-1]], w, b, 1e-5)


def rms_norm(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("schedule", ROW_TUNINGS)
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "softmax_to_float", "layer_norm", "layer_norm_plain",
                                "rms_norm", "var_mean", "amax_sum"])
def test_row_forward(op, schedule, dtype):
    x, w, b = rand(5, 37, dtype=dtype), rand(37, dtype=dtype), rand(37, dtype=dtype)
    fn, args = {
        "softmax": (lambda x: torch.softmax(x, -1), [x]),
        "log_softmax": (lambda x: torch.log_softmax(x, -1), [x]),
        "softmax_to_float": (lambda x: torch.softmax(x, -1, dtype=torch.float32), [x]),
        "layer_norm": (layer_norm, [x, w, b]),
        "layer_norm_plain": (lambda x: layer_norm(x, None, None), [x]),
        "rms_norm": (rms_norm, [x, w]),
        "var_mean": (lambda x: torch.var_mean(x, -1), [x]),
        "amax_sum": (lambda x, w: (x.amax(-1, keepdim=True), (x * w).sum(-1)), [x, w]),
    }[op]
    check(fn, *args, dtype=dtype, tuning=ROW_TUNINGS[schedule])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("schedule", ROW_TUNINGS)
@pytest.mark.parametrize("op", ["softmax_backward", "log_softmax_backward", "layer_norm_backward"])
def test_row_backward(op, schedule, dtype):
    x, g, w, b = (rand(5, 37, dtype=dtype), rand(5, 37, dtype=dtype), rand(37, dtype=dtype), rand(37, dtype=dtype))
    if op == "layer_norm_backward":
        _, mean, rstd = layer_norm(x, w, b)
        args = [g, x, mean, rstd, w, b]

        def fn(g, x, mean, rstd, w, b):
            return aten.native_layer_norm_backward(g, x, [37], mean, rstd, w, b, [True, False, False])[0]
    else:
        forward = aten._softmax if op == "softmax_backward" else aten._log_softmax
        backward = aten._softmax_backward_data if op == "softmax_backward" else aten._log_softmax_backward_data
        args = [g, forward(x, -1, False)]

        def fn(g, y):
            return backward(g, y, -1, dtype)
    check(fn, *args, dtype=dtype, tuning=ROW_TUNINGS[schedule])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("schedule", ROW_TUNINGS)
def test_row_noncontiguous_and_broadcast_inputs(schedule, dtype):
    """Transposed rows, a 3-D permuted input (outer dims that do not merge), a per-row [N, 1] input,
    a [D] weight and a 0-dim scalar."""
    tuning = ROW_TUNINGS[schedule]
    check(lambda x, s: torch.softmax(x * s, -1), rand(37, 6, dtype=dtype).t(), rand(6, 1, dtype=dtype),
          dtype=dtype, tuning=tuning)
    x = rand(4, 3, 37, dtype=dtype).transpose(0, 1)
    check(lambda x, w, b, c: layer_norm(x * c, w, b), x, rand(37, dtype=dtype), rand(37, dtype=dtype),
          rand(dtype=dtype), dtype=dtype, tuning=tuning)


@pytest.mark.parametrize("schedule", ROW_TUNINGS)
@pytest.mark.parametrize("shape", [(37,), (5, 1), (2, 3, 37)], ids=str)
def test_row_edge_shapes(shape, schedule):
    """One row (no row dims: one program), rows of one column, and per-row outputs over two row dims."""
    check(lambda x: (torch.softmax(x, -1), x.amax(-1, keepdim=True), torch.var_mean(x, -1, correction=0)[0]),
          rand(*shape), tuning=ROW_TUNINGS[schedule])


# ---- views inside a region ------------------------------------------------------------------------

def meta(*tensors):
    return [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in tensors]


def kernel_spec(fn, *inputs, tuning=SMALL):
    """The planned spec of fn's region: it must hold no view (views are rewritten away before planning)."""
    gm = make_fx(fn)(*inputs)
    tk.check(gm.graph, meta(*inputs))                # what the fusion pass asks, on meta tensors
    spec = tk.compile_region(gm.graph, inputs, tuning=tuning).launch_for(list(inputs)).spec
    assert not {"view", "expand"} & {i.op for i in spec.instrs}
    return spec


VIEW_CHAINS = {    # the patterns between matmuls in GPT-2 and LLaMA: [B*T, C] <-> [B, T, C]
    "view_gelu_tanh_view": (lambda x: F.gelu(x.view(2, 3, 40), approximate="tanh").view(6, 40), [(6, 40)]),
    "residual_add_view_bias": (lambda x, y, b: x + y.view(2, 3, 40) + b, [(2, 3, 40), (6, 40), (40,)]),
    "view_silu_mul_view": (lambda a, b: (F.silu(a.view(2, 3, 40)) * b.view(2, 3, 40)).view(6, 40), [(6, 40)] * 2),
    "view_gelu_backward_view": (lambda g, x: aten.gelu_backward(g.view(2, 3, 40), x).view(6, 40),
                                [(6, 40), (2, 3, 40)]),
    "view_gelu_backward_tanh_view": (lambda g, x: aten.gelu_backward(g.view(2, 3, 40), x, approximate="tanh")
                                     .view(6, 40), [(6, 40), (2, 3, 40)]),
    "repeat_kv": (lambda k, y: k.unsqueeze(2).expand(2, 2, 2, 5, 8).clone().view(2, 4, 5, 8) * y,
                  [(2, 2, 5, 8), (2, 4, 5, 8)]),
    "per_row_view": (lambda x, r: x.view(2, 3, 37) * r.view(2, 3, 1).squeeze(-1).unsqueeze(-1), [(6, 37), (6,)]),
}


FLAT_CHAINS = {"view_gelu_tanh_view", "view_silu_mul_view", "view_gelu_backward_view", "view_gelu_backward_tanh_view"}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("chain", VIEW_CHAINS)
def test_views_between_pointwise_ops_are_one_kernel(chain, dtype):
    fn, shapes = VIEW_CHAINS[chain]
    inputs = [rand(*s, dtype=dtype) for s in shapes]
    check(fn, *inputs, dtype=dtype)
    spec = kernel_spec(fn, *inputs)
    if chain in FLAT_CHAINS:       # contiguous values of one numel: each read and written at the flat index
        assert spec.ndim == 1 and all(a.dims is None for a in spec.inputs + tuple(a for _, a in spec.outputs))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("schedule", ROW_TUNINGS)
def test_view_then_last_dim_reductions(schedule, dtype):
    """softmax after a view ([B*T, C] -> [B, T, C]) and a split of the row ([N, 40] -> [N, 4, 10]) reduce the
    right elements; LayerNorm with a residual add through a view, its backward through views, and
    keepdim=False reductions viewed afterwards."""
    tuning = ROW_TUNINGS[schedule]
    x, w, b = rand(6, 37, dtype=dtype), rand(37, dtype=dtype), rand(37, dtype=dtype)
    check(lambda x: torch.softmax(x.view(2, 3, 37), -1).view(6, 37), x, dtype=dtype, tuning=tuning)
    check(lambda x: torch.softmax(x.view(6, 4, 10), -1), rand(6, 40, dtype=dtype), dtype=dtype, tuning=tuning)
    r = rand(2, 3, 37, dtype=dtype)
    check(lambda r, y, w, b: [v.view(6, 37) if v.shape[-1] == 37 else v
                              for v in aten.native_layer_norm(r + y.view(2, 3, 37), [37], w, b, 1e-5)],
          r, x, w, b, dtype=dtype, tuning=tuning)
    _, mean, rstd = layer_norm(r, w, b)
    check(lambda g, r, m, s, w, b: aten.native_layer_norm_backward(g.view(2, 3, 37), r, [37], m, s, w, b,
                                                                   [True, False, False])[0].view(6, 37),
          x, r, mean, rstd, w, b, dtype=dtype, tuning=tuning)
    check(lambda x: (x.view(2, 3, 37).sum(-1).view(6), x.view(2, 3, 37).amax(-1, keepdim=True).squeeze(-1)),
          x, dtype=dtype, tuning=tuning)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_views_of_noncontiguous_inputs_use_their_strides(dtype):
    """A view of a strided input splits its dims, which strides express exactly: read in place. Outputs
    that are views keep eager's strides (here a transposed value viewed)."""
    sliced = rand(6, 80, dtype=dtype)[:, :40]                       # rows 80 apart
    check(lambda x: F.gelu(x.view(6, 4, 10)) * 2, sliced, dtype=dtype)
    permuted = rand(3, 10, 2, dtype=dtype).permute(2, 0, 1)          # [2, 3, 10], strides (1, 20, 2)
    check(lambda x: torch.sigmoid(x.reshape(6, 10)) + 1, permuted, dtype=dtype)         # clone + _unsafe_view
    check(lambda x: torch.sigmoid(x.reshape(2, 3, 2, 5)) + 1, permuted, dtype=dtype)    # a view
    transposed = rand(37, 6, dtype=dtype).t()
    check(lambda x: (F.gelu(x), (F.gelu(x) + 1).view(2, 3, 37)), transposed, dtype=dtype)
    check(lambda x, w: torch.softmax(x.reshape(12, 37) * w, -1), rand(4, 3, 37, dtype=dtype).transpose(0, 1),
          rand(37, dtype=dtype), dtype=dtype)


@pytest.mark.parametrize("fn, shapes, message", [
    (lambda x: F.silu(x * 2).reshape(40, 6) + 1, [(6, 40)], r"views between shapes .* no one iteration shape"),
    (lambda x: torch.softmax(x.view(6, 40), -1), [(6, 4, 10)], r"a view splits or merges that dim"),
    (lambda x: x.view(6, 40).sum(-1), [(6, 4, 10)], r"a view splits or merges that dim"),
    (lambda x: (x.view(2, 3, 20), F.gelu(x.view(2, 3, 20))), [(6, 20)], r"output 0 is a view of input 0"),
    (lambda x: (F.gelu(x), F.gelu(x).view(2, 3, 20)), [(6, 20)], r"output 1 is a view of another output"),
    (lambda x: x.view(2, 3, 20).view(6, 20), [(6, 20)], r"output 0 is a view of input 0"),
    (lambda x: x.squeeze(1) - (x * 0.5), [(2, 1, 18)], r"elements do not line up"),   # x[i, 0, k] and x[j, 0, k]
    (lambda x: x.expand(6, 2).sum(-1, keepdim=True) + 1, [(6, 1)], r"sum over a row that an expand broadcasts"),
], ids=["6x40_as_40x6", "softmax_merged_row", "sum_merged_row", "view_of_input", "view_of_output",
        "views_alone", "two_alignments", "sum_of_expanded_row"])
def test_views_not_fusible(fn, shapes, message):
    """Refused (on meta tensors too), never computed wrong: a view no iteration shape can express, a
    reduction whose row a view splits, a region output aliasing an input or another output (the fusion
    pass leaves that view outside the kernel, where it is free), one value read at two elements."""
    inputs = [rand(*s) for s in shapes]
    gm = make_fx(fn)(*inputs)
    with pytest.raises(tk.NotFusible, match=message):
        tk.compile_region(gm.graph, inputs)
    with pytest.raises(tk.NotFusible, match=message):
        tk.check(gm.graph, meta(*inputs))


def test_fusion_pass_takes_views_into_regions():
    """An MLP between matmuls, `addmm -> view -> gelu -> mul -> view -> addmm`, becomes one kernel
    through its views, planned on meta tensors by the fusion pass; a lone op between views (the
    residual add) is left to aten: a kernel would move the same bytes. The graph computes the same."""
    from colauto_backend import fusion

    def block(x, w1, b1, w2, b2):
        h = torch.addmm(b1, x.view(6, 8), w1.t()).view(2, 3, 16)
        return x + torch.addmm(b2, (F.gelu(h, approximate="tanh") * 0.5).view(6, 16), w2.t()).view(2, 3, 8)
    inputs = [rand(2, 3, 8), rand(16, 8), rand(16), rand(8, 16), rand(8)]
    gm = make_fx(block)(*inputs)
    want = gm(*inputs)
    done = fusion.fuse(gm)
    assert (done.regions, done.ops) == (1, 2)          # [view, gelu, mul, view]: two ops that compute
    left = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert not {aten.gelu.default, aten.mul.Tensor} & left and aten.add.Tensor in left
    torch.testing.assert_close(gm(*inputs), want)


# ---- what is not fusible --------------------------------------------------------------------------

@pytest.mark.parametrize("fn, message", [
    (lambda x, y: torch.cumsum(x, -1), r"aten.cumsum.default is not fusible"),
    (lambda x, y: x.unsqueeze(0).sum(1), r"aten.sum.dim_IntList over dims \[1\] is not fusible"),   # x.sum(0): colwise
    (lambda x, y: x[0] + y, r"aten.select.int is not fusible"),
    (lambda x, y: (x * 2, y * 3), r"pointwise outputs of shapes .* are not fusible"),
    (lambda x, y: x.double() + 1, r"dtype torch.float64, which is not fusible"),
], ids=["cumsum", "sum_dim0", "select", "output_shapes", "float64"])
def test_not_fusible(fn, message):
    x, y = rand(4, 6), rand(6)
    gm = make_fx(fn)(x, y)
    with pytest.raises(tk.NotFusible, match=message):
        tk.compile_region(gm.graph, [x, y])


def test_layer_norm_backward_weight_grads_not_fusible():
    x, g, w = rand(4, 6), rand(4, 6), rand(6)
    _, mean, rstd = layer_norm(x, w, w)
    gm = make_fx(lambda g, x, m, r, w: aten.native_layer_norm_backward(g, x, [6], m, r, w, w, [True, True, True]))(
        g, x, mean, rstd, w)
    with pytest.raises(tk.NotFusible, match="grad_weight or grad_bias is not fusible"):
        tk.compile_region(gm.graph, [g, x, mean, rstd, w])


def python(script: str, **env) -> str:
    """stdout of `script` run by a fresh interpreter that imports this checkout."""
    done = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, PYTHONPATH=REPO, **env),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# ---- cache --------------------------------------------------------------------------------------

CACHED = "lambda x, y: torch.sigmoid(x * 1.2345) + y"      # a constant no other test uses: a fresh spec


def test_second_compile_hits_and_file_is_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("COLAUTO_CACHE_DIR", str(tmp_path))
    x, y = rand(5, 37), rand(37)
    gm = make_fx(eval(CACHED))(x, y)
    before = tk.cache_stats()
    tk.compile_region(gm.graph, [x, y], tuning=SMALL)
    middle = tk.cache_stats()
    region = tk.compile_region(gm.graph, [x, y], tuning=SMALL)
    after = tk.cache_stats()
    assert middle["misses"] == before["misses"] + 1
    assert after["misses"] == middle["misses"] and after["memory_hits"] == middle["memory_hits"] + 1
    assert len(list(tmp_path.glob("*.py"))) == 1
    torch.testing.assert_close(region(x, y)[0], gm(x, y))
    tk.compile_region(gm.graph, [x.to(torch.bfloat16), y], tuning=SMALL)     # another dtype: another kernel
    assert tk.cache_stats()["misses"] == after["misses"] + 1


def test_second_process_reads_the_disk_cache(tmp_path):
    """A fresh process finds the kernel the first one generated and generates nothing."""
    script = textwrap.dedent(f"""
        import json, os, torch
        from torch.fx.experimental.proxy_tensor import make_fx
        import triton_kernels as tk
        torch.manual_seed(0)
        x, y = torch.randn(5, 37), torch.randn(37)
        gm = make_fx({CACHED})(x, y)
        region = tk.compile_region(gm.graph, [x, y], tuning=tk.Tuning(block=64))
        error = (region(x, y)[0] - gm(x, y)).abs().max().item()
        print(json.dumps(dict(tk.cache_stats(), error=error, files=len(os.listdir(os.environ["COLAUTO_CACHE_DIR"])))))
    """)
    env = dict(COLAUTO_CACHE_DIR=str(tmp_path), TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    runs = [json.loads(python(script, **env).splitlines()[-1]) for _ in range(2)]
    assert (runs[0]["misses"], runs[0]["disk_hits"]) == (1, 0)
    assert (runs[1]["misses"], runs[1]["disk_hits"]) == (0, 1)
    assert runs[1]["files"] == 1 and runs[0]["error"] < 1e-6 and runs[1]["error"] < 1e-6


def test_print_kernels(monkeypatch, capfd, tmp_path):
    monkeypatch.setenv("COLAUTO_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("COLAUTO_PRINT_KERNELS", "1")
    x = rand(3, 5)
    tk.compile_region(make_fx(lambda x: x * 4.321)(x).graph, [x])
    err = capfd.readouterr().err
    assert "@triton.jit" in err and "def colauto_pointwise_mul(" in err and str(tmp_path) in err


def test_unavailable_without_triton():
    script = textwrap.dedent("""
        import sys, torch
        sys.modules["triton"] = None        # makes `import triton` fail
        import triton_kernels as tk
        ok = tk.available()
        try:
            tk.compile_region(torch.fx.Graph(), [])
        except RuntimeError as e:
            print(bool(ok), "|", ok.reason, "|", e)
    """)
    out = python(script)
    assert out.startswith("False | triton is not importable") and "Triton kernels are unavailable" in out


@pytest.mark.parametrize("family", ["rowwise", "colwise"])
def test_autotune_keeps_the_fastest_launch_shape_and_saves_it(monkeypatch, tmp_path, family):
    """On CUDA each candidate launch shape is timed with the real inputs (here: a stand-in timer on
    the interpreter); the fastest is kept, and a later process reads it back instead of timing."""
    from triton_kernels import _triton, autotune
    monkeypatch.setenv("COLAUTO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "enabled", lambda: True)
    x = rand(300, 40) if family == "colwise" else rand(6, 40)
    fn, candidates = {"rowwise": (lambda x: torch.softmax(x, -1), tk.tuning.ROW_CANDIDATES),
                      "colwise": (lambda x: torch.ops.aten.sum.dim_IntList(x * x, [0]), tk.tuning.COLUMN_CANDIDATES)}[family]
    gm = make_fx(fn)(x)
    timed = []

    def timer(fn):                       # runs the candidate, then reports the second one fastest
        fn()
        timed.append(len(timed))
        return 1.0 if len(timed) == 2 else 5.0 + len(timed)
    monkeypatch.setattr(_triton, "do_bench", timer)
    region = tk.compile_region(gm.graph, [x])
    launch = region.launch_for([x])
    analysed = tk.compile.analyse(gm.graph, [x])
    kind = getattr(tk.compile, family)
    shapes = list(dict.fromkeys(autotune.shape(kind.plan(analysed, t)) for t in candidates))
    assert len(timed) == len(shapes) >= 3, "each distinct launch shape is timed once"
    second = shapes[1]
    assert autotune.shape(launch) == second
    torch.testing.assert_close(region(x)[0], fn(x))

    monkeypatch.setattr(_triton, "do_bench", lambda fn: pytest.fail("timed again despite the saved choice"))
    before = autotune.STATS["from_disk"]
    again = tk.compile_region(gm.graph, [x]).launch_for([x])
    assert autotune.shape(again) == second and autotune.STATS["from_disk"] == before + 1


def test_repeat_launches_go_direct_unless_alignment_changes():
    """After the first launch a Launch calls the compiled kernel directly (CUDA; the interpreter has no
    compiled kernel), and goes back through Triton's JIT when an input's alignment differs from the
    first call's (Triton specialized the kernel on it). Each call's result is checked."""
    base = rand(2 * 37 * 5 + 1)
    aligned, shifted = base[:37 * 5].view(5, 37), base[1:1 + 37 * 5].view(5, 37)    # 4-byte offset
    gm = make_fx(lambda x: torch.sigmoid(x) * 3.0)(aligned)
    region = tk.compile_region(gm.graph, [aligned], tuning=tk.Tuning(block=64))
    launch = region.launch_for([aligned])
    for x in (aligned, aligned, shifted, shifted, aligned):
        torch.testing.assert_close(region(x)[0], gm(x))
        direct = launch._direct is not None
        assert direct == (DEVICE == "cuda") and launch._aligned == ((x.data_ptr() % 16 == 0),)


# ---- columns: sums over the rows ---------------------------------------------------------------------

COLUMN_TUNINGS = {"default": None, "split": tk.Tuning(column_block=16, column_rows=4, column_programs=8)}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("schedule", COLUMN_TUNINGS)
@pytest.mark.parametrize("op", ["bias_grad", "bias_grad_3d", "producer_chain", "transposed", "viewed", "layer_norm_weights",
                                "layer_norm_weight_only", "layer_norm_bias_only"])
def test_column_sums(op, schedule, dtype):
    """Sums over every dim but the last (bias and LayerNorm weight/bias gradients) against aten, with
    rows split over several programs and column blocks that do not divide the columns."""
    g, x, w = rand(37, 45, dtype=dtype), rand(37, 45, dtype=dtype), rand(45, dtype=dtype)
    _, mean, rstd = layer_norm(x, w, w)

    def ln_backward(mask):
        return lambda g, x, mean, rstd, w: [t for t in aten.native_layer_norm_backward(
            g, x, [45], mean, rstd, w, w, mask)[1:] if t is not None]
    fn, args = {
        "bias_grad": (lambda g: aten.sum.dim_IntList(g, [0], True), [g]),
        "bias_grad_3d": (lambda g: aten.sum.dim_IntList(g, [0, 1]), [rand(3, 13, 45, dtype=dtype)]),
        # upcast first, as autocast's backward graphs do (eager would round each op of a half chain)
        "producer_chain": (lambda g, w, r: aten.sum.dim_IntList(g.float() * w.float() + r.float(), [0]),
                           [g, w, rand(37, 1, dtype=dtype)]),
        "transposed": (lambda g: aten.sum.dim_IntList(g, [0]), [rand(45, 37, dtype=dtype).t()]),
        # RMSNorm's weight gradient: matmul outputs [B*T, C] summed, viewed as [B, T, C], times x
        "viewed": (lambda a, b, x: aten.sum.dim_IntList(aten.view.default(a.float() + b.float(), [3, 13, 45]) * x.float(),
                                                       [0, 1], True), [rand(39, 45, dtype=dtype), rand(39, 45, dtype=dtype),
                                                                       rand(3, 13, 45, dtype=dtype)]),
        "layer_norm_weights": (ln_backward([False, True, True]), [g, x, mean, rstd, w]),
        "layer_norm_weight_only": (ln_backward([False, True, False]), [g, x, mean, rstd, w]),
        "layer_norm_bias_only": (ln_backward([False, False, True]), [g, x, mean, rstd, w]),
    }[op]
    if not (op.startswith("layer_norm") and dtype != torch.float32):
        check(fn, *args, dtype=dtype, tuning=COLUMN_TUNINGS[schedule])
        return
    # aten's CPU LayerNorm backward accumulates half inputs less precisely than fp32: here the fused
    # sums must be at least as close as aten's to the fp64 answer
    gm = make_fx(fn)(*args)
    got = tk.compile_region(gm.graph, args, tuning=COLUMN_TUNINGS[schedule])(*args)
    xhat = (x.double() - mean.double()) * rstd.double()
    exact = {"layer_norm_weights": [(g.double() * xhat).sum(0), g.double().sum(0)],
             "layer_norm_weight_only": [(g.double() * xhat).sum(0)], "layer_norm_bias_only": [g.double().sum(0)]}[op]
    for ours, theirs, want in zip(got, gm(*args), exact, strict=True):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        err, aten_err = (ours.double() - want).abs().max().item(), (theirs.double() - want).abs().max().item()
        assert err <= aten_err + TOL[dtype]["atol"], (err, aten_err)


def test_column_sum_refusals():
    g = rand(6, 7)
    for fn, reason in [(lambda g: aten.sum.dim_IntList(g, [0]) * 2, "computed from a column sum"),
                       (lambda g: (aten.sum.dim_IntList(g * 2, [0]), g * 2), "stores anything but column sums"),
                       (lambda g: aten.sum.dim_IntList(g.view(3, 14), [0]), "do not line up"),   # splits the columns
                       (lambda g: (aten.sum.dim_IntList(g, [0]), g.sum(-1)), "row reductions in one region")]:
        gm = make_fx(fn)(g)
        with pytest.raises(tk.NotFusible, match=reason):
            tk.check(gm.graph, [g])
    empty = rand(0, 7)
    with pytest.raises(tk.NotFusible, match="empty tensor"):
        tk.check(make_fx(lambda g: aten.sum.dim_IntList(g, [0]))(empty).graph, [empty])
