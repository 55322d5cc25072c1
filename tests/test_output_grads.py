"""Outputs returned beside the loss (an HF model's logits): the backward is compiled without their
gradients and autograd makes no zero tensor for them (colauto_backend/output_grads.py)."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode

import colauto_backend
from colauto_backend import counters, output_grads
from examples.hf_zoo import build_hf

aten = torch.ops.aten
ZERO_FILLS = {aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default, aten.zero_.default,
              aten.fill_.Scalar, aten.full.default, aten.full_like.default}


class ZeroFills(TorchDispatchMode):
    """The shapes of the real tensors that zero-filling ops make while it is on (autograd's materialized
    zero gradients are `zeros` calls on the thread that runs a CPU backward; a backward compiled lazily
    then makes fake ones)."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in ZERO_FILLS and isinstance(out, torch.Tensor) and not isinstance(out, FakeTensor):
            self.shapes.append(tuple(out.shape))
        return out


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def train_step(name, options, backward=lambda out: out.loss.backward()):
    """One compiled step of HF `name`: (its output, the zero fills of its backward, its gradients) and eager's
    gradients for the same batch."""
    torch.manual_seed(0)
    model, make = build_hf(name)
    ref, _ = build_hf(name)
    batch = make(2, 16)
    compiled = torch.compile(model, backend="colauto", options=options)
    out = compiled(**batch)
    with ZeroFills() as fills:
        backward(out)
    backward(ref(**batch))
    return out, fills.shapes, grads(model), grads(ref)


@pytest.mark.parametrize("name", ["qwen2", "t5"])
def test_backward_makes_no_zero_gradient_for_the_logits(name):
    """Under codegen inductor the backward neither receives nor makes a zero tensor of the logits' shape
    (with output_grads=all, as plain torch.compile, autograd makes one: the check can fail), and the
    gradients equal eager's."""
    options = {"codegen": "inductor"}
    out, fills, got, ref = train_step(name, options)
    logits = tuple(out.logits.shape)
    assert logits not in fills
    assert got.keys() == ref.keys() and got
    for key in got:
        torch.testing.assert_close(got[key], ref[key], atol=1e-4, rtol=1e-3, msg=key)
    assert counters.counter("backward graphs without the gradients of outputs beside the loss")["backward graphs"] >= 1
    torch._dynamo.reset()
    out, fills, _, _ = train_step(name, options | {"output_grads": "all"})
    assert logits in fills


def test_a_gradient_into_the_logits_raises_and_output_grads_all_computes_it():
    """A loss that also reads the logits: the hook on them raises before the backward runs (never a
    gradient silently left out); with output_grads=all the same step equals eager."""
    def both(out):
        (out.loss + out.logits.logsumexp(-1).mean()).backward()
    assert colauto_backend.UnusedGradError is output_grads.UnusedGradError
    with pytest.raises(colauto_backend.UnusedGradError, match="output_grads"):
        train_step("qwen2", {"codegen": "aten"}, both)
    torch._dynamo.reset()
    _, _, got, ref = train_step("qwen2", {"codegen": "aten", "output_grads": "all"}, both)
    for key in ref:
        torch.testing.assert_close(got[key], ref[key], atol=1e-5, rtol=1e-4, msg=key)


@pytest.mark.parametrize("codegen", ["aten", "inductor"])
def test_dynamic_shapes_skip_the_logits_gradient_at_every_size(codegen):
    """With dynamic shapes the logits' sizes are symbolic: the backward builds its zeros from its own size
    inputs (counted), at two batch sizes through the same graphs the gradients equal eager's and, under
    Inductor, no logits-shaped zero tensor is made; a gradient into the logits still raises."""
    skipped = counters.counter("backward graphs without the gradients of outputs beside the loss")
    before = skipped["backward graphs"]
    torch.manual_seed(0)
    model, make = build_hf("qwen2")
    ref, _ = build_hf("qwen2")
    compiled = torch.compile(model, backend="colauto", dynamic=True, options={"codegen": codegen})
    for b, t in [(2, 16), (3, 24)]:
        batch = make(b, t)
        out = compiled(**batch)
        with ZeroFills() as fills:
            out.loss.backward()
        ref(**batch).loss.backward()
        if codegen == "inductor":   # aten runs the backward's `full` as an op; Inductor folds the zeros away
            assert tuple(out.logits.shape) not in fills.shapes
        got, want = grads(model), grads(ref)
        assert got.keys() == want.keys() and got
        for key in got:
            torch.testing.assert_close(got[key], want[key], atol=1e-4, rtol=1e-3, msg=key)
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
    assert skipped["backward graphs"] > before
    out = compiled(**make(2, 20))
    with pytest.raises(colauto_backend.UnusedGradError, match="output_grads"):
        (out.loss + out.logits.logsumexp(-1).mean()).backward()


def test_graph_without_a_loss_keeps_every_gradient():
    """A graph that returns no 0-dim output (its loss is computed after it) keeps its outputs' gradients:
    they are the loss's path, and equal eager's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    ref = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    ref.load_state_dict(model.state_dict())
    x = torch.randn(3, 8)
    before = dict(counters.counter("backward graphs without the gradients of outputs beside the loss"))
    torch.compile(model, backend="colauto")(x).pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert dict(counters.counter("backward graphs without the gradients of outputs beside the loss")) == before


def test_report_names_the_outputs(capsys):
    train_step("qwen2", {"codegen": "aten", "report": "1"})
    assert "outputs returned beside the loss get no gradient" in capsys.readouterr().out


def test_bad_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv("COLAUTO_OUTPUT_GRADS", "some")
    with pytest.raises(colauto_backend.ConfigError, match="COLAUTO_OUTPUT_GRADS='some' is not valid: use one of loss, all"):
        colauto_backend.config.load()
