"""COLAUTO_CODEGEN=triton: the planned graphs' fusible regions run as generated Triton kernels (on CPU in
Triton's interpreter, which conftest turns on) and training still equals eager (fp32)."""
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton", reason="triton is not importable: COLAUTO_CODEGEN=triton has nothing to run")

from colauto_backend import fusion, fusion_prep, report  # noqa: E402
from examples.models import MODEL_NAMES, build  # noqa: E402
from test_training import check_matches_eager  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NATIVE = [n for n in MODEL_NAMES if not n.startswith("hf_")]


def _fused(f, *args, **fuse_kwargs):
    """(f's aten graph traced on fake tensors, then fused; what fuse() reported)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    gm = make_fx(f, tracing_mode="fake")(*args)
    return gm, fusion.fuse(gm, **fuse_kwargs)


def _rewritten(f, rewrite, *args):
    """f's aten graph traced on fake tensors with one fusion_prep rewrite applied."""
    from torch.fx.experimental.proxy_tensor import make_fx
    gm = make_fx(f, tracing_mode="fake")(*args)
    rewrite(gm.graph)
    gm.recompile()
    return gm


def _called(gm) -> set:
    return {n.target for n in gm.graph.nodes}


def _assert_matches(gm, f, *args, **tolerance):
    for got, ref in zip(gm(*args), f(*args), strict=True):
        torch.testing.assert_close(got, ref, **tolerance)


@pytest.mark.parametrize("name", NATIVE)
def test_training_matches_eager_with_generated_kernels(name, fused_graphs):
    fallbacks = sum(fusion.FALLBACKS.values())
    check_matches_eager(name, "triton")
    done = [d for _, d in fused_graphs]
    assert len(done) == 2 and not any(d.unavailable for d in done)     # forward and backward graphs
    assert sum(d.ops for d in done) >= 2, "nothing was fused: the test would not exercise a kernel"
    assert sum(fusion.FALLBACKS.values()) == fallbacks                  # every region ran its kernel
    for d in done:
        assert d.regions == len(d.kernels)


def test_fused_graph_calls_custom_ops_in_place_of_the_region(fused_graphs):
    model, make = build("llama")
    x, y = make(2, 8)
    torch.compile(model, backend="colauto", options={"codegen": "triton"})(x, y).backward()
    gm, done = fused_graphs[0]
    called = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert sum(str(t).startswith("colauto.fused_") for t in called) == done.regions > 0
    assert torch.ops.aten.rsqrt.default not in called           # RMSNorm's chain went into a kernel
    assert done.bytes_saved > 0


def test_report_lists_fused_regions(capsys):
    model, make = build("llama")
    torch.compile(model, backend="colauto", options={"codegen": "triton", "report": "1"})(*make(2, 8)).backward()
    out = capsys.readouterr().out
    assert "colauto triton fusion (forward):" in out and "colauto triton fusion (backward):" in out
    assert report.render_fusion({"graph": "forward", "unavailable": "no triton", "regions": 0, "ops": 0,
                                 "kernels": [], "bytes_saved": 0}).endswith("none, no triton")


def test_without_triton_the_graphs_run_as_aten_and_say_so_once():
    code = (
        "import sys, warnings; sys.modules['triton'] = None\n"
        "import torch\n"
        "from examples.models import build\n"
        "m, mk = build('llama'); ref, _ = build('llama'); x, y = mk(2, 8)\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    loss = torch.compile(m, backend='colauto', options={'codegen': 'triton'})(x, y); loss.backward()\n"
        "said = [str(x.message) for x in w if 'COLAUTO_CODEGEN=triton' in str(x.message)]\n"
        "assert len(said) == 1 and 'triton is not importable' in said[0], said\n"
        "torch.testing.assert_close(loss, ref(x, y))\n"
        "print('ok')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLAUTO_")} | {"PYTHONPATH": REPO}
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.stdout.strip().endswith("ok"), run.stderr[-2000:]


def test_bad_print_kernels_value_is_one_line(monkeypatch):
    from colauto_backend import config
    monkeypatch.setenv("COLAUTO_PRINT_KERNELS", "yes")
    with pytest.raises(config.ConfigError, match="COLAUTO_PRINT_KERNELS='yes' is not valid"):
        config.load()


@pytest.mark.parametrize("name", ["gpt2", "cnn"])
def test_cross_entropy_runs_as_the_hand_written_kernels(name, fused_graphs):
    """aten's log_softmax + nll_loss pairs (forward and backward) become colauto::cross_entropy_fwd/bwd:
    no [N, V] log-probabilities in either graph; training still equals eager (test above)."""
    model, make = build(name)
    torch.compile(model, backend="colauto", options={"codegen": "triton"})(*make(2, 16 if name == "cnn" else 8)).backward()
    forward, backward = ({str(n.target) for n in gm.graph.nodes if n.op == "call_function"} for gm, _ in fused_graphs)
    assert "colauto.cross_entropy_fwd.default" in forward and "colauto.cross_entropy_bwd.default" in backward
    assert "colauto.cross_entropy_fwd.default" not in backward        # lse is saved, not recomputed
    assert not {t for t in forward | backward if "log_softmax" in t or "nll_loss" in t}


class _HalfHead(torch.nn.Module):
    """bf16 logits upcast for the loss, as autocast does to cross_entropy; or, as language models do,
    [B, T, V] logits upcast and then flattened to [B*T, V]."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 40, dtype=torch.bfloat16)

    def forward(self, x, y):
        return torch.nn.functional.cross_entropy(self.proj(x).float().view(-1, 40), y.view(-1))


@pytest.mark.parametrize("batch,dynamic", [((12,), False), ((3, 4), False), ((3, 4), True)],
                         ids=["2d", "3d-then-flattened", "3d-symbolic-sizes"])
def test_cross_entropy_reads_half_logits_without_an_fp32_copy(fused_graphs, batch, dynamic):
    """The fp32 copy of bf16 logits and its fp32 gradient are dropped: the kernels read bf16 and write
    the bf16 gradient; loss and gradients equal eager's (which computes in fp32 and rounds the same)."""
    torch.manual_seed(0)
    model = _HalfHead()
    ref = _HalfHead()
    ref.load_state_dict(model.state_dict())
    x, y = torch.randn(*batch, 16, dtype=torch.bfloat16), torch.randint(0, 40, batch)
    loss = torch.compile(model, backend="colauto", options={"codegen": "triton"}, dynamic=dynamic)(x, y)
    loss.backward()
    want = ref(x, y)
    want.backward()
    torch.testing.assert_close(loss, want)
    for p, q in zip(model.parameters(), ref.parameters()):   # the fp32 gradients' sums differ in order:
        torch.testing.assert_close(p.grad, q.grad, rtol=1.6e-2, atol=1e-2 * q.grad.abs().max().item())  # bf16 ulps
    seen = [gm for gm, _ in fused_graphs]
    assert len(seen) == 2
    ce = [n for gm in seen for n in gm.graph.nodes if str(n.target).startswith("colauto.cross_entropy")]
    assert len(ce) == 2 and all(n.args[0 if "fwd" in str(n.target) else 1].meta["val"].dtype == torch.bfloat16 for n in ce)
    wide = [n for gm in seen for n in gm.graph.nodes
            if isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].numel() == 12 * 40
            and n.meta["val"].dtype == torch.float32]
    assert not wide, f"an fp32 [N, V] tensor is still in the graphs: {wide}"


def test_regions_of_cuda_graphs_with_device_constants_are_planned_on_cuda():
    """Planning checks a region on storage-less inputs on the graph's own device: a constant made on
    'cuda' (scalar_tensor, _to_copy with device=) meets CUDA inputs, not meta ones (no GPU needed)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    aten = torch.ops.aten
    with FakeTensorMode():
        x = torch.empty(4, 8, device="cuda", dtype=torch.bfloat16)
        gm = make_fx(lambda x: aten.mul.Tensor(
            aten._to_copy.default(aten.exp.default(x), dtype=torch.float32, device=x.device),
            aten.scalar_tensor.default(0.5, dtype=torch.float32, device=x.device)))(x)
    done = fusion.fuse(gm)
    assert done.ops == 4 and not done.unavailable
    assert not {aten.exp.default, aten.mul.Tensor} & {n.target for n in gm.graph.nodes}


def test_layer_norm_backward_splits_so_its_input_gradient_fuses(fused_graphs):
    """The backward's LayerNorms are split into the input gradient and the weight/bias column sums,
    and both run as kernels, as do the bias gradients' sums: none stays aten. Training equality is the
    test above."""
    model, make = build("gpt2")
    torch.compile(model, backend="colauto", options={"codegen": "triton"})(*make(2, 8)).backward()
    nodes = list(fused_graphs[1][0].graph.nodes)
    assert torch.ops.aten.native_layer_norm_backward.default not in {n.target for n in nodes}
    column_sums = [n for n in nodes if n.target is torch.ops.aten.sum.dim_IntList
                   and sorted(n.args[1]) == list(range(n.args[0].meta["val"].dim() - 1))]
    assert not column_sums      # (the position embedding's sum over the batch alone is no column sum)


def test_a_lone_cast_or_other_op_is_no_kernel():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    aten = torch.ops.aten
    with FakeTensorMode():
        x = torch.empty(4, 8, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(4, 8, device="cuda", dtype=torch.float32)
        widening = make_fx(lambda x: aten.mm.default(aten._to_copy.default(x, dtype=torch.float32), x.new_ones(8, 8, dtype=torch.float32)))(x)
        narrowing = make_fx(lambda y: aten.mm.default(aten._to_copy.default(y, dtype=torch.bfloat16), y.new_ones(8, 8, dtype=torch.bfloat16)))(y)
        gelu = make_fx(lambda x: aten.mm.default(aten.gelu.default(x), x.new_ones(8, 8)))(x)
    # a kernel call costs more CPU time than it saves GPU time on one op (LayerNorm backward aside)
    assert [fusion.fuse(g).regions for g in (widening, narrowing, gelu)] == [0, 0, 0]


def test_under_cuda_graphs_a_lone_op_is_a_kernel_of_its_own():
    """fuse(lone_ops=True), which the backend asks for when the graph will be replayed: each op that joined
    no region runs as a kernel; the transposed weight gradient's cast keeps its strides, as aten's does."""
    from torch.fx.experimental.proxy_tensor import make_fx
    aten = torch.ops.aten

    def f(g, x):
        wgrad = aten._to_copy.default(aten.t.default(aten.mm.default(g, x)), dtype=torch.float32)
        return wgrad, aten.gelu.default(g)
    g, x = torch.randn(6, 5, dtype=torch.bfloat16), torch.randn(5, 7, dtype=torch.bfloat16)
    for lone_ops, regions in ((False, 0), (True, 2)):
        gm = make_fx(f, tracing_mode="fake")(g, x)
        assert fusion.fuse(gm, lone_ops=lone_ops).regions == regions
        for got, ref in zip(gm(g, x), f(g, x)):
            assert got.stride() == ref.stride()
            torch.testing.assert_close(got, ref)
    assert {aten._to_copy.default, aten.gelu.default}.isdisjoint(n.target for n in gm.graph.nodes)


def test_a_view_read_between_a_regions_nodes_does_not_split_it():
    """AOT detaches RMSNorm's rstd for the backward right after computing it, before `x * rstd * w`: the
    fused call goes before the detach, so the whole norm is one kernel (it was two)."""
    aten = torch.ops.aten

    def f(x, w):
        rstd = aten.rsqrt.default(aten.add.Tensor(aten.mean.dim(aten.mul.Tensor(x, x), [-1], True), 1e-6))
        saved = aten.detach.default(rstd)
        return aten.mul.Tensor(aten.mul.Tensor(x, rstd), w), saved
    x, w = torch.randn(6, 5), torch.randn(5)
    gm, done = _fused(f, x, w)
    assert done.regions == 1
    assert aten.mul.Tensor not in _called(gm)
    _assert_matches(gm, f, x, w)


def test_an_expand_read_by_pointwise_ops_folds_into_their_broadcast():
    """The mean's backward in RMSNorm: expand(per-row value) / C * x. The division moves before the expand
    and the expand disappears into the multiply's broadcast, so norm and rows are one row kernel. A
    clone of an expand (a materialized repeat, then viewed) keeps its layout: it is left alone."""
    aten = torch.ops.aten

    def f(g, x):
        per_row = aten.sum.dim_IntList(aten.mul.Tensor(g, x), [-1], True)
        spread = aten.div.Scalar(aten.expand.default(per_row, [4, 3, 5]), 5)
        repeated = aten.clone.default(aten.expand.default(aten.unsqueeze.default(x, 1), [4, 2, 3, 5]))
        return aten.mul.Tensor(spread, x), aten.view.default(repeated, [8, 3, 5])
    g, x = torch.randn(4, 3, 5), torch.randn(4, 3, 5)
    folded = _rewritten(f, fusion_prep.fold_expands, g, x)
    left = [n.target for n in folded.graph.nodes if n.op == "call_function"]
    assert left.count(aten.expand.default) == 1                     # the repeat's
    _assert_matches(folded, f, g, x, rtol=0, atol=0)                # the rewrite alone: bit for bit
    gm, done = _fused(f, g, x)
    assert done.regions == 1
    assert aten.div.Scalar not in _called(gm)
    _assert_matches(gm, f, g, x)


def test_ops_reading_the_same_tensor_share_a_kernel_placed_before_the_first_reader():
    """SwiGLU's backward: grad * silu(gate) (read by a matmul at once) and silu's backward of grad * up
    (read later) both read grad: one kernel computes both, called before the first matmul."""
    aten = torch.ops.aten

    def f(grad, gate, up, silu, w):
        up_grad = aten.mm.default(aten.mul.Tensor(grad, silu), w)
        gate_grad = aten.silu_backward.default(aten.mul.Tensor(grad, up), gate)
        return up_grad, aten.mm.default(gate_grad, w)
    args = [torch.randn(6, 4) for _ in range(4)] + [torch.randn(4, 3)]
    gm, done = _fused(f, *args)
    assert (done.regions, done.ops) == (1, 3)
    assert not {aten.mul.Tensor, aten.silu_backward.default} & _called(gm)
    _assert_matches(gm, f, *args)


@pytest.mark.parametrize("dtype,cast,sum_dtype", [(torch.float32, None, None), (torch.bfloat16, None, None),
                                                   (torch.bfloat16, torch.float32, None),
                                                   (torch.bfloat16, None, torch.float32),           # CUDA autocast
                                                   (torch.bfloat16, torch.float32, torch.float32)])
def test_a_sum_over_a_short_middle_dim_becomes_adds_in_one_kernel(dtype, cast, sum_dtype):
    """Grouped-query attention's backward sums the key/value gradients over the query heads of each kv
    head ([B, kv, rep, T, D], dim 2), after an fp32 cast for the keys: selects and adds, the cast on each
    select, all in the kernel with what follows. Equal to aten's sum (half: fp32 adds, one rounding)."""
    aten = torch.ops.aten

    def f(g, s):
        x = g if cast is None else aten._to_copy.default(g, dtype=cast)
        summed = aten.sum.dim_IntList(aten.view.default(x, [2, 3, 4, 5, 6]), [2], True, dtype=sum_dtype)
        return aten.mul.Tensor(aten.squeeze.dim(summed, 2), s)
    g, s = torch.randn(2, 12, 5, 6, dtype=dtype), torch.randn(5, 6, dtype=dtype)
    unrolled = _rewritten(f, fusion_prep.unroll_small_sums, g, s)
    assert aten.sum.dim_IntList not in _called(unrolled)
    torch.testing.assert_close(unrolled(g, s), f(g, s), rtol=0, atol=0)   # (4 terms: aten adds in order too)
    gm, done = _fused(f, g, s)
    assert done.regions == 1
    assert not {aten.sum.dim_IntList, aten._to_copy.default, aten.mul.Tensor} & _called(gm)
    torch.testing.assert_close(gm(g, s), f(g, s))


def test_a_view_input_placed_after_an_outside_reader_moves_up_to_the_call():
    """RMSNorm's backward: its rows are read by a matmul at once, while AOT's detach of the saved rstd
    sits below that matmul. The detach views a graph input, so it is ready from the start: the norm is
    one kernel, called before the matmul, with the detach moved up to it."""
    aten = torch.ops.aten

    def f(g, x, rstd, w, m):
        scaled = aten.mul.Tensor(g, w)
        per_row = aten.sum.dim_IntList(aten.mul.Tensor(scaled, x), [-1], True)
        early = aten.mm.default(aten.mul.Tensor(scaled, rstd), m)
        cubed = aten.pow.Tensor_Scalar(aten.detach.default(rstd), 3)
        return early, aten.mul.Tensor(x, aten.mul.Tensor(per_row, cubed))
    args = [torch.randn(6, 5), torch.randn(6, 5), torch.rand(6, 1) + 0.5, torch.randn(5), torch.randn(5, 3)]
    gm, done = _fused(f, *args)
    assert done.regions == 1
    assert not {aten.mul.Tensor, aten.pow.Tensor_Scalar, aten.sum.dim_IntList} & _called(gm)
    _assert_matches(gm, f, *args)


def test_a_cast_read_by_two_kernels_is_cast_inside_each():
    """bf16 -> fp32 read by two fused regions: no aten cast stays; each kernel reads the bf16 tensor.
    The fused graph computes what the graph computed."""
    from torch.fx.experimental.proxy_tensor import make_fx
    aten = torch.ops.aten

    def f(x, y):
        wide = aten._to_copy.default(x, dtype=torch.float32)
        return aten.mul.Tensor(aten.exp.default(wide), y), aten.sum.dim_IntList(aten.mul.Tensor(wide, y), [0])
    x, y = torch.randn(6, 5, dtype=torch.bfloat16), torch.randn(6, 5)
    gm = make_fx(f, tracing_mode="fake")(x, y)
    want = f(x, y)
    done = fusion.fuse(gm)
    assert done.regions == 2
    assert aten._to_copy.default not in {n.target for n in gm.graph.nodes}
    for got, ref in zip(gm(x, y), want):
        torch.testing.assert_close(got, ref)


def test_copies_of_a_cast_that_no_kernel_takes_become_one_again():
    from torch.fx.experimental.proxy_tensor import make_fx
    aten = torch.ops.aten

    def f(x):   # two readers the generator refuses (sums over a middle dim): the cast must run once, as aten
        wide = aten._to_copy.default(x, dtype=torch.float32)
        return aten.sum.dim_IntList(wide, [1]), aten.sum.dim_IntList(wide, [0])
    x = torch.randn(10, 12, 5, dtype=torch.bfloat16)   # (dims longer than SMALL_SUM: not unrolled)
    gm = make_fx(f, tracing_mode="fake")(x)
    assert fusion.fuse(gm).regions == 0
    assert sum(n.target is aten._to_copy.default for n in gm.graph.nodes) == 1
    for got, ref in zip(gm(x), f(x)):
        torch.testing.assert_close(got, ref)


def test_identical_casts_become_one_inside_their_producers_kernel():
    """Autocast casts a shared input once per linear layer (q, k, v): the copies become one, which joins
    the kernel that computes the tensor, so no aten cast is left."""
    from torch.fx.experimental.proxy_tensor import make_fx
    aten = torch.ops.aten

    def f(x, w):
        y = aten.mul.Tensor(aten.exp.default(x), 2.0)
        return [aten.mm.default(aten._to_copy.default(y, dtype=torch.bfloat16), w) for _ in range(3)]
    x, w = torch.randn(6, 5), torch.randn(5, 4, dtype=torch.bfloat16)
    gm = make_fx(f, tracing_mode="fake")(x, w)
    assert sum(n.target is aten._to_copy.default for n in gm.graph.nodes) == 3
    assert fusion.fuse(gm).regions == 1
    assert aten._to_copy.default not in {n.target for n in gm.graph.nodes}
    for got, ref in zip(gm(x, w), f(x, w)):   # exp may differ by an fp32 ulp, which can flip a bf16 rounding
        torch.testing.assert_close(got, ref, rtol=0.05, atol=0.05 * ref.abs().max().item())


def test_two_producers_regions_meet_in_one_kernel():
    """A node reading two regions joins the later and merges the other in (RMSNorm's backward: a row
    sum broadcast back meets the rows it scales), so neither intermediate goes through memory."""
    from torch.fx.experimental.proxy_tensor import make_fx
    aten = torch.ops.aten

    def f(x, y):
        a = aten.mul.Tensor(aten.exp.default(x), 2.0)
        b = aten.mul.Tensor(aten.neg.default(y), 3.0)
        return aten.add.Tensor(a, b)
    x, y = torch.randn(6, 5), torch.randn(6, 5)
    gm = make_fx(f, tracing_mode="fake")(x, y)
    done = fusion.fuse(gm)
    assert (done.regions, done.ops) == (1, 5)
    torch.testing.assert_close(gm(x, y), f(x, y))


def test_a_node_reading_one_region_twice_joins_it_once(recwarn):
    """Two inputs from one region: the region is merged in once (no op computed twice, none erased twice)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    aten = torch.ops.aten

    def f(x):
        a = aten.exp.default(x)
        return aten.add.Tensor(a, aten.mul.Tensor(a, 2.0))
    x = torch.randn(4, 8)
    gm = make_fx(f, tracing_mode="fake")(x)
    done = fusion.fuse(gm)
    assert (done.regions, done.ops) == (1, 3)
    assert not [w for w in recwarn if "erase_node" in str(w.message)]
    torch.testing.assert_close(gm(x)[0] if isinstance(gm(x), (list, tuple)) else gm(x), f(x))


def test_a_plans_recomputed_ops_join_no_region():
    """A backward that recomputes a residual stream (h_k = h_(k-1) + s_k over the layers, read by each
    layer's backward in reverse order): fused, the chain is placeable as one kernel before its first
    reader, which then writes every layer's value at the start of the backward and holds each until its
    layer reads it. HF Llama 1.1B under codegen triton on an H100 held 178 such outputs, 2.5 GiB over the
    modelled peak (bench/results/h100-2026-12-06-triton-recompute/). The plan's recomputed ops join no
    region and stay where the partition placed them; the step computes the same."""
    aten = torch.ops.aten
    layers = 4

    def f(g, w, *saved):
        h = [aten.mul.Tensor(saved[0], 2.0)]
        for s in saved[1:]:
            h.append(aten.add.Tensor(h[-1], s))
        out = []
        for hk in reversed(h):   # the last layer's backward first
            g = aten.mm.default(aten.mul.Tensor(g, hk), w)
            out.append(g)
        return tuple(out)
    args = [torch.randn(6, 4), torch.randn(4, 4)] + [torch.randn(6, 4) for _ in range(layers)]

    def chain(gm):
        return {n.name for n in gm.graph.nodes if n.target is aten.add.Tensor
                or n.target is aten.mul.Tensor and n.args[1] == 2.0}
    unplanned, done = _fused(f, *args)    # without a plan, the chain is one kernel with an output per layer
    assert not chain(unplanned) and done.regions >= 1
    from torch.fx.experimental.proxy_tensor import make_fx
    gm = make_fx(f, tracing_mode="fake")(*args)
    recomputed = frozenset(chain(gm))
    assert len(recomputed) == layers
    done = fusion.fuse(gm, recomputed=recomputed)
    assert chain(gm) == recomputed and done.recomputed_left == layers   # still aten ops, in place
    _assert_matches(gm, f, *args)
