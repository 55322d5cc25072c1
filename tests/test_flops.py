"""FLOPs from ONE symbolic profile, substituted with .at, equal FlopCounterMode's eager fwd+bwd count."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import colauto_backend
from examples.models import MODEL_NAMES, build

IMAGE = ("vit", "cnn", "hf_vit")
SIZES = {"text": [(2, 8), (3, 16), (5, 12)], "image": [(2, 16), (3, 24), (4, 32)]}


def eager_flops(model, inputs) -> int:
    counter = FlopCounterMode(display=False)
    with counter:
        model(*inputs).backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_flops_match_flop_counter_at_three_sizes(name):
    model, make = build(name)
    sizes = SIZES["image" if name in IMAGE else "text"]
    prof = colauto_backend.profile(model, *make(*sizes[0]))
    for b, s in sizes:
        inputs = make(b, s)
        at = prof.at(*inputs)
        assert at.flops_fwd + at.flops_bwd == eager_flops(model, inputs), (name, b, s)
        assert at.flops_bwd > at.flops_fwd > 0


def test_cpu_flash_attention_formula_matches_the_math():
    """Our formula for aten._scaled_dot_product_flash_attention_for_cpu (FlopCounterMode has none)
    against the count of the same attention written as explicit matmuls."""
    q, k, v = (torch.randn(2, 3, 7, 5, requires_grad=True) for _ in range(3))
    fused, math = FlopCounterMode(display=False), FlopCounterMode(display=False)
    with fused:
        F.scaled_dot_product_attention(q, k, v).sum().backward()
    with math:
        (torch.softmax(q @ k.transpose(-1, -2) / 5**0.5, -1) @ v).sum().backward()
    assert math.get_total_flops() == 2 * 3 * (2 * 7 * 7 * (5 + 5)) * 3  # fwd 2 matmuls, bwd 4
    assert fused.get_total_flops() == math.get_total_flops()



def test_fused_attention_is_timed_at_the_devices_attention_rate():
    """Under bf16 autocast with the h200 preset, each SDPA node's predicted time is its FLOPs by the math
    (2*b*h*s*s*(d_q+d_v) forward, twice that backward) at the preset's attention rate for s keys, by the
    math: 250 TFLOP/s x s / (s + 375), plus one launch (compute-bound at these sizes), where the matmul
    rate would give a fifth of it or less."""
    from colauto_backend.backend import ANALYSES
    from colauto_backend.cost.device import PRESETS

    b, s, heads, d = 2, 512, 4, 16

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(heads * d, 3 * heads * d)

        def forward(self, x):
            q, k, v = self.qkv(x).view(b, s, 3, heads, d).permute(2, 0, 3, 1, 4)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True).float().sum()

    spec = PRESETS["h200"]
    with torch.autocast("cpu", torch.bfloat16):
        colauto_backend.profile(Attn(), torch.randn(b, s, heads * d), options={"device": "h200", "memory_budget": "none"})
    analysis = ANALYSES[-1]
    ev = analysis.evaluate(analysis.hints)
    per_pass = 2 * b * heads * s * s * (d + d)
    attention = sorted((f, t) for n, t, f in zip(analysis.costs.nodes, ev["_node_times"], ev["_node_flops"])
                       if "scaled_dot_product" in n.op)
    assert [f for f, _ in attention] == [per_pass, 2 * per_pass]
    rate = 250e12 * s / (s + 375)
    for f, t in attention:
        assert t == pytest.approx(f / rate + spec.launch_s, rel=1e-9)
        assert t > 5 * f / spec.matmul_flops


def test_attention_dropout_is_read_from_the_ops_schema():
    """dropout_p, wherever the op's schema puts it (positional, keyword, or its default), marks an
    attention node as applying dropout (costed attention_dropout_factor times as long)."""
    from colauto_backend.cost import flops as F
    aten = torch.ops.aten
    q = k = v = torch.empty(1, 2, 8, 4)
    assert F.attention_dropout(aten._scaled_dot_product_cudnn_attention.default, (q, k, v, None, True, 0.1), {})
    assert not F.attention_dropout(aten._scaled_dot_product_cudnn_attention.default, (q, k, v, None, True), {})
    assert F.attention_dropout(aten._scaled_dot_product_flash_attention.default, (q, k, v), {"dropout_p": 0.2})
    assert not F.attention_dropout(aten._scaled_dot_product_flash_attention.default, (q, k, v, 0.0), {})
    # per key position: the forward's FLOPs over s_k, and the backward's twice that
    assert F.attention_per_key(aten._scaled_dot_product_flash_attention.default, (q, k, v)) == 2 * 1 * 2 * 8 * (4 + 4)
    grad = torch.empty(1, 2, 8, 4)
    assert F.attention_per_key(aten._scaled_dot_product_flash_attention_backward.default,
                               (grad, q, k, v)) == 4 * 1 * 2 * 8 * (4 + 4)
