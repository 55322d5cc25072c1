"""COLAUTO_CUDAGRAPHS=1: which graphs can be recorded (checked on fake CUDA graphs, no GPU needed), that
a graph which cannot runs as before and is counted, and, on a GPU, that replayed training equals eager."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from colauto_backend import counters, cuda_graphs, report
from examples.models import build
from test_training import step

aten = torch.ops.aten


def _fake_cuda_graph(fn, *shapes):
    with FakeTensorMode():
        inputs = [torch.empty(*s, device="cuda") for s in shapes]
        return make_fx(fn)(*inputs), inputs


@pytest.mark.parametrize("fn, reason", [
    (lambda x: aten.relu.default(aten.mul.Tensor(x, 2.0)), None),
    (lambda x: aten.add_.Tensor(x, 1.0), "mutates its input"),
    (aten.nonzero.default, "depends on data"),
    (torch.ops._c10d_functional.wait_tensor.default, "collectives"),
    (lambda x: aten._to_copy.default(x, device="cpu"), "makes a tensor on cpu"),
], ids=["pointwise", "in-place", "data-dependent", "collective", "to-cpu"])
def test_which_graphs_can_be_recorded(fn, reason):
    if isinstance(fn, torch._ops.OpOverload):   # (make_fx cannot trace these here: the op is put in by hand)
        gm, inputs = _fake_cuda_graph(lambda x: aten.relu.default(x), (4, 8))
        if fn is aten.nonzero.default:
            _unbacked_output(gm, fn)
        else:
            next(n for n in gm.graph.nodes if n.op == "call_function").target = fn
    else:
        gm, inputs = _fake_cuda_graph(fn, (4, 8))
    got = cuda_graphs.why_not(gm, inputs)
    assert got is None if reason is None else reason in got


def _unbacked_output(gm, target):
    """Put `target` in place of the graph's first op, its traced output sized by an unbacked symbol (a size
    known only once the op has run: what Dynamo traces for nonzero or a boolean-mask index)."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    node.target = target
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        node.meta["val"] = torch.empty(mode.shape_env.create_unbacked_symint(), 2, device="cuda")
    return gm


def test_index_is_data_dependent_only_where_its_size_is():
    """HF's mask functions index with integer tensors (aten.index.Tensor, tagged dynamic_output_shape):
    the traced size is known, so the graph is recorded; a boolean-mask index's is not."""
    with FakeTensorMode():
        x = torch.empty(4, 8, device="cuda")
        i = torch.empty(3, dtype=torch.long, device="cuda")
        gm = make_fx(lambda x, i: aten.index.Tensor(x, [i]))(x, i)
    assert any(n.target is aten.index.Tensor for n in gm.graph.nodes)
    assert cuda_graphs.why_not(gm, [x, i]) is None
    assert "depends on data" in cuda_graphs.why_not(_unbacked_output(gm, aten.index.Tensor), [x, i])


@pytest.mark.parametrize("codegen", ["aten", "inductor"])
def test_cpu_graphs_run_as_before_and_are_counted(codegen, recwarn, monkeypatch, capsys):
    monkeypatch.setattr(report, "_WARNED", set())      # warned once per process: this test must see it
    before = sum(cuda_graphs.SKIPPED.values())
    model, make = build("gpt2")
    ref, _ = build("gpt2")
    inputs = make(2, 8)
    compiled = torch.compile(model, backend="colauto", options={"codegen": codegen, "cudagraphs": True, "report": "1"})
    loss, grads = step(model, inputs, compiled)
    ref_loss, ref_grads = step(ref, inputs)
    torch.testing.assert_close(loss, ref_loss)
    for key in grads:
        torch.testing.assert_close(grads[key], ref_grads[key], rtol=1e-4, atol=1e-5)
    # forward skipped (CPU inputs), and so the backward; the one counters registry holds the count
    assert sum(cuda_graphs.SKIPPED.values()) == before + 2
    assert sum(counters.snapshot()["counts"]["cuda graphs skipped"].values()) == before + 2
    assert any("COLAUTO_CUDAGRAPHS=1" in str(w.message) and "cpu" in str(w.message) for w in recwarn)
    out = capsys.readouterr().out      # COLAUTO_REPORT says so per graph
    assert "colauto cuda graphs (forward): not recorded: its inputs are on cpu" in out
    assert "colauto cuda graphs (backward): not recorded: its forward runs without CUDA graphs" in out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("codegen", ["aten", "inductor", "triton"])
def test_replayed_training_matches_eager_on_gpu(codegen):
    """Step 1 runs the graphs (warm-up), step 2 records them, steps 3-4 replay: each equals eager."""
    before = sum(cuda_graphs.SKIPPED.values())
    model, make = build("gpt2", device="cuda")
    ref, _ = build("gpt2", device="cuda")
    inputs = make(3, 12)
    ref_loss, ref_grads = step(ref, inputs)
    compiled = torch.compile(model, backend="colauto", options={"codegen": codegen, "cudagraphs": True})
    for _ in range(4):
        loss, grads = step(model, inputs, compiled)
        torch.testing.assert_close(loss, ref_loss, atol=1e-4, rtol=1e-5)
        for key in ref_grads:
            torch.testing.assert_close(grads[key], ref_grads[key], atol=1e-4, rtol=1e-4, msg=key)
    assert sum(cuda_graphs.SKIPPED.values()) == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("codegen", ["inductor", "triton"])
@pytest.mark.parametrize("name", ["llama", "gpt_neox"])
def test_hf_models_are_recorded_and_replay_like_eager_on_gpu(name, codegen):
    """HF causal LMs build their masks with integer-index aten.index.Tensor: their graphs are recorded (none
    skipped) under codegen=triton, and replayed steps equal eager."""
    from examples.hf_zoo import build_hf
    from test_hf_models import assert_same
    from test_hf_models import step as hf_step
    before = sum(cuda_graphs.SKIPPED.values())
    model, make = build_hf(name, device="cuda")
    ref, _ = build_hf(name, device="cuda")
    batch = make(2, 32)
    expected = hf_step(ref, ref, batch)
    compiled = torch.compile(model, backend="colauto", options={"codegen": codegen, "cudagraphs": True})
    for _ in range(4):
        assert_same(hf_step(model, compiled, batch), expected, atol=1e-4)
    assert sum(cuda_graphs.SKIPPED.values()) == before
