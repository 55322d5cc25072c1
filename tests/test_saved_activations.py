"""saved_activation_bytes from ONE profile (.at at 3 sizes) equals, to the byte, what the compiled
forward hands to backward, observed independently through autograd's saved-tensor hooks."""
import pytest
import torch

import colauto_backend
from examples.models import build


def measured_saved_bytes(model, inputs, compiled=None) -> int:
    excluded = {p.untyped_storage().data_ptr() for p in [*model.parameters(), *model.buffers()]}
    excluded |= {t.untyped_storage().data_ptr() for t in inputs}
    storages: dict[int, int] = {}

    def pack(t):
        if isinstance(t, torch.Tensor):
            s = t.untyped_storage()
            if s.data_ptr() not in excluded:
                storages[s.data_ptr()] = s.nbytes()
        return t

    if compiled is None:
        compiled = torch.compile(model, backend="colauto", dynamic=False)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        compiled(*inputs).backward()
    model.zero_grad(set_to_none=True)
    return sum(storages.values())


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "vit", "cnn"])
def test_saved_bytes_exact_at_three_sizes(name):
    model, make = build(name)
    image = name in ("vit", "cnn")
    sizes = [(2, 16), (3, 24), (4, 32)] if image else [(2, 8), (3, 16), (4, 12)]
    prof = colauto_backend.profile(model, *make(*sizes[0]))
    for b, s in sizes:
        torch._dynamo.reset()
        inputs = make(b, s)
        assert prof.at(*inputs).saved_activation_bytes == measured_saved_bytes(model, inputs), (name, b, s)


def test_inductor_codegen_saves_what_torch_compile_saves():
    """Under Inductor codegen with no budget, colauto's partition is torch.compile's own (min-cut), and
    the prediction for it is exact."""
    model, make = build("gpt2")
    inputs = make(4, 64)
    options = {"codegen": "inductor", "memory_budget": "none"}
    predicted = colauto_backend.profile(model, *inputs, options=options).saved_activation_bytes
    torch._dynamo.reset()
    ours = measured_saved_bytes(model, inputs, torch.compile(model, backend="colauto", options=options))
    torch._dynamo.reset()
    theirs = measured_saved_bytes(model, inputs, torch.compile(model))
    assert predicted == ours == theirs
