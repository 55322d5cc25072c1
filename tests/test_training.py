"""torch.compile(model, backend="colauto") trains and infers exactly like eager (fp32)."""
import pytest
import torch

from colauto_backend import backend as colauto_backend_module
from examples.models import MODEL_NAMES, build

IMAGE = ("vit", "cnn", "hf_vit")


def step(model, inputs, compiled=None):
    loss = (model if compiled is None else compiled)(*inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def check_matches_eager(name, codegen, atol=1e-5):
    model, make = build(name)
    inputs = make(3, 16 if name in IMAGE else 12)
    ref_model, _ = build(name)                      # same seeded weights and buffers
    ref_loss, ref_grads = step(ref_model, inputs)
    compiled = torch.compile(model, backend="colauto", options={"codegen": codegen})
    loss, grads = step(model, inputs, compiled)
    torch.testing.assert_close(loss, ref_loss, atol=atol, rtol=1e-5)
    assert grads.keys() == ref_grads.keys() and grads
    for key in grads:
        torch.testing.assert_close(grads[key], ref_grads[key], atol=atol, rtol=1e-4, msg=key)
    for (key, buf), (_, ref_buf) in zip(model.named_buffers(), ref_model.named_buffers()):
        torch.testing.assert_close(buf, ref_buf, msg=key)   # e.g. BatchNorm running statistics


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_training_matches_eager_aten(name):
    check_matches_eager(name, "aten")


@pytest.mark.parametrize("name", ["gpt2", "cnn"])
def test_training_matches_eager_inductor(name):
    check_matches_eager(name, "inductor", atol=1e-4)


@pytest.mark.parametrize("name", ["gpt2", "hf_bert", "cnn"])
def test_inference_no_grad(name):
    model, make = build(name)
    model.eval()
    (x, _) = make(2, 16 if name in IMAGE else 8)
    with torch.no_grad():
        ref = model(x)
        before = len(colauto_backend_module.ANALYSES)
        out = torch.compile(model, backend="colauto")(x)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert len(colauto_backend_module.ANALYSES) == before + 1   # the inference graph was costed


def test_dynamic_shapes_profile_once():
    """dynamic=True: three batch/sequence sizes run through one compiled graph and one cost model."""
    model, make = build("gpt2")
    compiled = torch.compile(model, backend="colauto", dynamic=True)
    before = len(colauto_backend_module.ANALYSES)
    for b, t in [(2, 8), (3, 16), (5, 12)]:
        inputs = make(b, t)
        loss, grads = step(model, inputs, compiled)
        ref_loss, ref_grads = step(model, inputs)
        torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=1e-5)
    assert len(colauto_backend_module.ANALYSES) == before + 1
    assert colauto_backend_module.ANALYSES[-1].names   # the analysis is symbolic in the sizes


def test_mark_dynamic_profile_once():
    model, make = build("llama")
    compiled = torch.compile(model, backend="colauto")
    before = len(colauto_backend_module.ANALYSES)
    for t in (8, 16, 24):
        x, y = make(2, t)
        torch._dynamo.mark_dynamic(x, 1)
        torch._dynamo.mark_dynamic(y, 1)
        step(model, (x, y), compiled)
    assert len(colauto_backend_module.ANALYSES) == before + 1
