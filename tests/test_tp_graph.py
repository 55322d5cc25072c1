"""Tensor parallelism on the captured graph (colauto_backend/parallel/tp_graph.py), piece by piece on one
process: the pins the plan puts into Dynamo's graph, and the lift of a rank's graph over the ranks' stacked
micro-batches, against eager PyTorch run on each micro-batch. Training under tp on several ranks, against
one process on the global batch: tests/test_parallel_data.py (TP_2, RUNS_4) and tests/test_dist.py."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from colauto_backend.parallel import tp_graph
from colauto_backend.parallel.entry import state_names
from colauto_backend.parallel.plan import ParallelPlan

PIN = torch.ops.colauto.tp_pin.default


class Block(nn.Module):
    """Attention heads made by a view with the micro-batch's sizes written in, an MLP, and a tensor the
    forward makes whose shape holds the batch."""

    def __init__(self, c=16, heads=4):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(c, c, bias=False) for _ in range(4))
        self.up, self.down = nn.Linear(c, 2 * c), nn.Linear(2 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (w(x).view(b, t, self.heads, c // self.heads).transpose(1, 2) for w in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.o(a)
        keep = torch.ones(b, t, 1)
        return (x + self.down(F.gelu(self.up(x))) * keep).pow(2).mean()


def capture(model, *inputs):
    """The graph Dynamo captures, its example inputs, and its state inputs' names (read inside the backend
    call, as colauto's is: Dynamo drops the sources afterwards)."""
    got = []
    torch._dynamo.reset()
    torch.compile(model, backend=lambda gm, ex: got.append((gm, ex, state_names(gm))) or gm.forward,
                  fullgraph=True)(*inputs)
    torch._dynamo.reset()
    return got[0]


def plan_for(names: dict[int, str]) -> ParallelPlan:
    """Megatron's pairs on a tp=2 mesh: q/k/v/up column (rows sharded), o/down row (columns sharded)."""
    role = {"q": "S0", "k": "S0", "v": "S0", "up": "S0", "o": "S1", "down": "S1"}
    spec = {n: ((role[n.split(".")[0]] if n.endswith("weight") or role[n.split(".")[0]] == "S0" else "R"),)
            for n in names.values()}
    return ParallelPlan((("tp", 2),), spec, spec, {m: "col" if r == "S0" else "row" for m, r in role.items()})


def test_pins_gather_column_inputs_and_scatter_row_outputs():
    """Each column linear's input is pinned once (q, k and v share theirs: one pin), each row linear's output
    once; the pinned graph computes what the captured one does (a pin is the identity outside a mesh)."""
    torch.manual_seed(0)
    model, x = Block(), torch.randn(2, 8, 16)
    gm, ex, names = capture(model, x)
    pinned, count = tp_graph.pin(gm, names, plan_for(names))
    pins = [n for n in pinned.graph.nodes if n.target is PIN]
    col = [n for n in pins if n.args[1] == tp_graph._COL]
    row = [n for n in pins if n.args[1] == tp_graph._ROW]
    assert count == len(pins) == 4 and len(col) == 2 and len(row) == 2, pins
    # what each pin feeds or follows: the column linears' inputs, the row linears' outputs
    linears = {n for n in pinned.graph.nodes if n.op == "call_function" and "linear" in str(n.target)}
    assert sum(1 for p in col for u in p.users if u in linears) == 4          # q, k, v share x's pin; up
    assert all(p.args[0] in linears for p in row)
    assert not any(n.target is PIN for n in gm.graph.nodes)                  # the capture itself is untouched
    torch.testing.assert_close(pinned(*ex)[0], gm(*ex)[0], rtol=0, atol=0)


def test_lift_runs_each_ranks_micro_batch_as_eager_does():
    """The graph of one micro-batch (B=2, its view sizes literal), lifted over 3 stacked micro-batches, gives
    each one's loss as eager PyTorch does; a micro-batch of 1 too."""
    torch.manual_seed(0)
    model = Block()
    for batch in (2, 1):
        xs = torch.randn(3, batch, 8, 16)
        gm, ex, names = capture(model, xs[0])
        stacked = [i not in names for i in range(len(ex))]
        lifted = tp_graph.lift(gm, ex, stacked, 3)
        got = lifted(*[xs if s else t for s, t in zip(stacked, ex)])[0]
        want = torch.stack([model(x) for x in xs])
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_a_graph_vmap_cannot_lift_is_named():
    """BatchNorm in training updates its running statistics in place: vmap cannot lift it, and the error says
    so (the plan then runs on the DTensor path, counted)."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    gm, ex, names = capture(model, torch.randn(2, 3, 8, 8))
    stacked = [i not in names for i in range(len(ex))]
    with pytest.raises(tp_graph.NotLifted, match="vmap cannot lift it: .*Batch norm"):
        tp_graph.lift(gm, ex, stacked, 2)


def test_symbolic_sizes_are_not_lifted():
    """A graph with a symbolic size among its inputs is left to the DTensor path, with the reason."""
    plan = ParallelPlan((("tp", 2),), {}, {}, {"m": "col"})
    assert tp_graph.unsupported(None, [torch.zeros(2), 4], plan) == "the graph has symbolic sizes"
    assert tp_graph.unsupported(None, [torch.zeros(2)], plan) is None


def test_multi_dim_squeezes_become_single_dim_ones():
    """vmap writes `aten.squeeze.dims`, which torch 2.11's DTensor has no rule for: the lifted graph gets one
    `squeeze.dim` per dim instead, highest first (negative dims too), and computes what the original does."""
    from torch.fx.experimental.proxy_tensor import make_fx
    aten = torch.ops.aten
    x = torch.randn(1, 3, 1, 4, 1)
    gm = make_fx(lambda t: aten.squeeze.dims(t, [0, 2, -1]) * 2)(x)
    want = gm(x)
    tp_graph._split_multi_dim_squeezes(gm)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert aten.squeeze.dims not in targets
    assert [n.args[1] for n in gm.graph.nodes if n.target is aten.squeeze.dim] == [4, 2, 0]
    torch.testing.assert_close(gm(x), want, rtol=0, atol=0)
    assert gm(x).shape == (3, 4)


class _RoundThrough(torch.autograd.Function):
    """Rounding whose backward passes the gradient straight through (not the derivative of its forward)."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x * 4) / 4

    @staticmethod
    def backward(ctx, grad):
        return grad


def test_a_custom_autograd_function_is_not_lifted():
    """A custom autograd.Function in the captured graph (Dynamo's autograd_function_apply; HF BLOOM's GeLU):
    lifting it by make_fx would keep only its forward's ops and differentiate those, dropping its own
    backward (here the straight-through gradient, which is not rounding's derivative, zero). So it is not
    lifted, and the reason is named: the plan runs on the DTensor path, which keeps the Function."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16))

    def forward(x):
        return model[1](_RoundThrough.apply(model[0](x))).pow(2).mean()
    gm, ex, names = capture(forward, torch.randn(2, 16))
    assert any(n.target is torch.ops.higher_order.autograd_function_apply for n in gm.graph.nodes)
    stacked = [i not in names for i in range(len(ex))]
    with pytest.raises(tp_graph.NotLifted, match="vmap cannot lift it: .*vmap"):
        tp_graph.lift(gm, ex, stacked, 2)
