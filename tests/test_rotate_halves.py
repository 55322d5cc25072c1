"""RoPE's rotate_half cat rewritten as views + neg + where (colauto_backend.rotate_halves): bit-equal to the
cat it replaces (the reference is the traced function run eagerly), matched only where it applies, and
on the LLaMA model every cat goes into a generated kernel."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from colauto_backend import rotate_halves

aten = torch.ops.aten


def _traced(fn, *shapes):
    return make_fx(fn, tracing_mode="fake")(*[torch.randn(s) for s in shapes])


def _cats(gm) -> int:
    return sum(n.target is aten.cat.default for n in gm.graph.nodes)


def _rotate_split(x):           # the forward's form: chunk -> split + getitem
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rotate_slices(x):          # the backward's form: slices, the negated half second
    h = x.shape[-1] // 2
    return torch.cat((x[..., h:], -x[..., :h]), dim=-1)


def _swap(x):                   # no negation at all
    h = x.shape[-1] // 2
    return torch.cat((x[..., h:], x[..., :h]), dim=-1)


def _same_half_twice(x):
    h = x.shape[-1] // 2
    return torch.cat((x[..., :h], -x[..., :h]), dim=-1)


def _rope(x, cos, sin):         # as in examples.models: the cat between the multiplies
    return x * cos + _rotate_split(x) * sin


def _middle_dim(x):             # halves along dim 1 of a 3-d tensor
    a, b = x.split(x.shape[1] // 2, dim=1)
    return torch.cat((-b, a), dim=1)


@pytest.mark.parametrize("fn,shapes", [
    (_rotate_split, [(2, 3, 5, 8)]), (_rotate_slices, [(4, 6)]), (_swap, [(3, 10)]),
    (_same_half_twice, [(2, 4)]), (_rope, [(2, 3, 5, 8), (5, 8), (5, 8)]), (_middle_dim, [(2, 6, 3)]),
])
def test_rewritten_cat_equals_the_cat_bit_for_bit(fn, shapes):
    gm = _traced(fn, *shapes)
    assert _cats(gm) == 1
    assert rotate_halves.rewrite(gm) == 1
    assert _cats(gm) == 0
    called = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert aten.where.self in called
    for _ in range(3):
        args = [torch.randn(s) for s in shapes]
        args[0][0, 0] = float("inf")            # selection, not arithmetic: inf and nan come through as they are
        args[0][-1, -1] = float("nan")
        torch.testing.assert_close(gm(*args), fn(*args), rtol=0, atol=0, equal_nan=True)


def _uneven(x):
    return torch.cat((-x[..., 3:], x[..., :3]), dim=-1)


def _two_tensors(x, y):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], y[..., :h]), dim=-1)


def _other_dim(x):              # halves of the last dim, stacked along dim 0
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=0)


def _three_pieces(x):
    a, b, c = x.chunk(3, dim=-1)
    return torch.cat((-b, a, c), dim=-1)


@pytest.mark.parametrize("fn,shapes", [
    (_uneven, [(2, 8)]), (_two_tensors, [(2, 8), (2, 8)]), (_other_dim, [(2, 8)]), (_three_pieces, [(2, 9)]),
])
def test_other_cats_are_left_alone(fn, shapes):
    gm = _traced(fn, *shapes)
    assert rotate_halves.rewrite(gm) == 0
    assert _cats(gm) == 1


def test_llama_rope_cats_all_go_into_kernels(fused_graphs):
    pytest.importorskip("triton")
    from examples.models import build
    model, make = build("llama")
    torch.compile(model, backend="colauto", options={"codegen": "triton"})(*make(2, 8)).backward()
    layers = len(model.blocks)
    assert len(fused_graphs) == 2
    for gm, done in fused_graphs:                     # forward and backward: q and k in every layer
        assert done.rotations == 2 * layers
        called = [n.target for n in gm.graph.nodes if n.op == "call_function"]
        assert aten.cat.default not in called
        assert aten.neg.default not in called and aten.where.self not in called     # inside kernels
