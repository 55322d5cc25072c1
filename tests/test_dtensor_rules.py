"""The adapter over DTensor's sharding registries (colauto_backend/parallel/_dtensor_rules.py), checked against
DTensor itself at runtime: each op runs on DTensors of a fake 4-rank process group (meta local tensors, so
no values and no real communication), and the output placements and the redistributions DTensor records
(DebugMode) must equal what `propagate` predicts; ops `uncovered` names must be the ones that raise."""
import itertools
import operator
from types import SimpleNamespace
import random

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from colauto_backend.parallel import _dtensor_rules as rules

aten = torch.ops.aten
WORLD = 4


@pytest.fixture(scope="module")
def meshes():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    if dist.get_world_size() != WORLD:   # a failure, not a skip: an earlier test left its group running
        pytest.fail(f"a process group of {dist.get_world_size()} ranks is already running (an earlier test in this "
                    f"worker did not destroy it); these tests need {WORLD}")
    yield {"1d": init_device_mesh("cpu", (WORLD,)), "2d": init_device_mesh("cpu", (2, 2))}
    if started:
        dist.destroy_process_group()


def T(*shape, dtype=torch.float32):
    return torch.empty(shape, dtype=dtype, device="meta")


def I(*shape):
    return T(*shape, dtype=torch.long)


# (op, args, kwargs): ops of transformer training graphs; every dim divisible by the mesh sizes
CASES = [
    (aten.mm.default, (T(16, 8), T(8, 12)), {}),
    (aten.addmm.default, (T(12), T(16, 8), T(8, 12)), {}),
    (aten.bmm.default, (T(4, 16, 8), T(4, 8, 12)), {}),
    (aten.add.Tensor, (T(4, 16, 8), T(4, 16, 8)), {}),
    (aten.add.Tensor, (T(16, 8), T(8)), {}),
    (aten.mul.Tensor, (T(4, 16, 8), T(4, 16, 8)), {}),
    (aten.view.default, (T(4, 16, 8), [64, 8]), {}),
    (aten._unsafe_view.default, (T(4, 16, 8), [4, 128]), {}),
    (aten.transpose.int, (T(4, 16, 8), 1, 2), {}),
    (aten.t.default, (T(16, 8),), {}),
    (aten.expand.default, (T(16, 1), [16, 8]), {}),
    (aten.slice.Tensor, (T(16, 8), 1, 0, 4), {}),
    (aten.split.Tensor, (T(16, 24), 8, 1), {}),
    (aten.cat.default, ([T(16, 8), T(16, 8)], 1), {}),
    (aten._to_copy.default, (T(16, 8),), {"dtype": torch.bfloat16}),
    (aten.gelu.default, (T(16, 8),), {}),
    (aten.rsqrt.default, (T(16, 8),), {}),
    (aten._softmax.default, (T(4, 16, 8), -1, False), {}),
    (aten._softmax_backward_data.default, (T(4, 16, 8), T(4, 16, 8), -1, torch.float32), {}),
    (aten.native_layer_norm.default, (T(4, 16, 8), [8], T(8), T(8), 1e-5), {}),
    (aten.native_layer_norm_backward.default,
     (T(4, 16, 8), T(4, 16, 8), [8], T(4, 16, 1), T(4, 16, 1), T(8), T(8), [True, True, True]), {}),
    (aten.embedding.default, (T(32, 8), I(4, 16)), {}),
    (aten.index_select.default, (T(16, 8), 0, I(4)), {}),
    (aten.embedding_dense_backward.default, (T(4, 16, 8), I(4, 16), 32, -1, False), {}),
    (aten.sum.dim_IntList, (T(4, 16, 8), [0, 1]), {}),
    (aten.mean.dim, (T(4, 16, 8), [-1], True), {}),
    (aten.var_mean.correction, (T(4, 16, 8), [-1]), {"correction": 0, "keepdim": True}),
    (aten.nll_loss_forward.default, (T(16, 32), I(16), None, 1, -100), {}),
    (aten.mse_loss.default, (T(16, 8), T(16, 8), 1), {}),            # DTensor 2.13 traces its decomposition
    (aten._scaled_dot_product_efficient_attention.default, (T(4, 8, 16, 8), T(4, 8, 16, 8), T(4, 8, 16, 8), None, True),
     {"is_causal": True}),
    (aten._scaled_dot_product_flash_attention.default, (T(4, 8, 16, 8), T(4, 8, 16, 8), T(4, 8, 16, 8), 0.0, True), {}),
]


def candidates(t: torch.Tensor) -> list:
    """Placements one mesh dim may give a tensor: replicated, sharded on its first or last dim where that
    divides evenly, or partial (float only: a partial sum of indices means nothing)."""
    out = [Replicate()] + [Shard(d) for d in sorted({0, t.dim() - 1}) if t.dim() > 0 and t.shape[d] % WORLD == 0]
    return out + [Partial()] if t.dtype.is_floating_point else out


def combos(args, kwargs, mesh_ndim: int, seed: str, n: int = 6) -> list:
    """Up to n placement combinations for the call's tensors (pytree order), sampled with a fixed seed."""
    tensors = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    per_tensor = [list(itertools.product(candidates(t), repeat=mesh_ndim)) for t in tensors]
    every = list(itertools.product(*per_tensor))
    return random.Random(seed).sample(every, min(n, len(every)))


def on_mesh(args, kwargs, placements, mesh):
    """The call's tensors as DTensors with the given placements: meta local shards of the right size."""
    given = iter(placements)

    def wrap(t):
        pl = next(given)
        local = list(t.shape)
        for size, p in zip(mesh.shape, pl):
            if isinstance(p, Shard):
                local[p.dim] //= size
        return DTensor.from_local(torch.empty(local, dtype=t.dtype, device="meta"), mesh, pl, run_check=False,
                                  shape=t.shape, stride=t.stride())
    return torch.utils._pytree.tree_map_only(torch.Tensor, wrap, (args, kwargs))


def run_on_dtensors(op, args, kwargs, placements, mesh):
    """What DTensor does at runtime: output placements, and the redistributions it records as
    (tensor input index, from, to). The recorded source spec is the input DTensor's own spec object."""
    outs, redistributed, error = attempt_on_dtensors(op, args, kwargs, placements, mesh)
    if error is not None:
        raise error
    return outs, redistributed


def attempt_on_dtensors(op, args, kwargs, placements, mesh):
    """As run_on_dtensors, but an error comes back (outputs None) with the redistributions DTensor had
    decided and started before it (DebugMode records each one before running it); an error before any
    decision (propagation refused) comes back as NotImplementedError."""
    from torch.utils._debug_mode import DebugMode
    dargs, dkwargs = on_mesh(args, kwargs, placements, mesh)
    inputs = [t for t in torch.utils._pytree.tree_leaves((dargs, dkwargs)) if isinstance(t, DTensor)]
    result, error = None, None
    with DebugMode() as dm:
        try:
            result = op(*dargs, **dkwargs)
        except (NotImplementedError, RuntimeError) as e:
            error = e
    redistributed = []
    for call in dm.operators:
        if type(call).__name__ == "_RedistributeCall" and call.is_outer_call:
            index = [i for i, t in enumerate(inputs) if t._spec is call.src_placement]
            assert len(index) == 1, f"{op}: cannot tell which input DTensor redistributed"
            redistributed.append((index[0], tuple(call.src_placement.placements), tuple(call.dst_placement.placements)))
    if error is not None:   # failed after deciding (DebugMode logs the decided output placements) or before
        decided = any(type(call).__name__ == "_OutputPlacementCall" for call in dm.operators)
        return None, tuple(sorted(redistributed)), error if decided else NotImplementedError(str(error))
    outs = result if isinstance(result, (tuple, list)) else (result,)
    outs = tuple(tuple(o.placements) if isinstance(o, DTensor) else None for o in outs)
    return outs, tuple(sorted(redistributed)), None


def same(a, b) -> bool:
    """Equal placements. By repr: embedding's _MaskPartial carries a per-call mask buffer that makes two
    equal placements compare unequal."""
    return repr(a) == repr(b)


@pytest.mark.parametrize("mesh_name", ["1d", "2d"])
@pytest.mark.parametrize("op,args,kwargs", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_propagate_matches_dtensor_at_runtime(meshes, mesh_name, op, args, kwargs):
    """Where DTensor runs the op: the same output placements and redistributions. Where it fails after
    deciding (torch 2.11 cannot run Shard -> Partial; a local kernel may reject the shards): the same
    redistributions up to the failure. Where its propagation refuses: propagate refuses too."""
    mesh = meshes[mesh_name]
    decided = 0
    for placements in combos(args, kwargs, mesh.ndim, seed=f"{op}-{mesh_name}"):
        outs, redistributed, error = attempt_on_dtensors(op, args, kwargs, placements, mesh)
        try:
            got = rules.propagate(op, args, kwargs, placements, mesh)
        except (NotImplementedError, RuntimeError):
            assert isinstance(error, NotImplementedError), f"{op} with inputs {placements}: DTensor decided it"
            continue
        assert not isinstance(error, NotImplementedError), f"{op} with inputs {placements}: DTensor refused: {error}"
        predicted = tuple(sorted(got.redistribute))
        if error is None:
            assert same((got.out, predicted), (outs, redistributed)), f"{op} with inputs {placements}"
        else:   # inputs are redistributed in order: those before the failure
            assert same(predicted[:len(redistributed)], redistributed), f"{op} with inputs {placements}: {error}"
        decided += 1
    # DTensor 2.11 traces var_mean's decomposition and fails for every placement: nothing to compare
    assert decided or rules.rule_kind(op) == "decomposition", f"{op}: DTensor decided none of the sampled placements"
    assert rules.rule_kind(op) is not None


def test_propagate_reports_redistribution_and_partial(meshes):
    """A fixed case whose answer follows from the meaning of the placements, not from DTensor's code:
    x @ w with x sharded on its inner dim needs w's rows sharded alike and leaves partial sums."""
    got = rules.propagate(aten.mm.default, (T(16, 8), T(8, 12)), {}, [(Shard(1),), (Replicate(),)], meshes["1d"])
    assert got.out == ((Partial(),),)
    assert got.redistribute == ((1, (Replicate(),), (Shard(0),)),)


def test_rule_kind_of_known_ops():
    assert rules.rule_kind(aten.mm.default) == "strategy"
    assert rules.rule_kind(aten.convolution.default) == "handler"        # DTensor's hand-written tp conv
    assert rules.rule_kind(aten.linear.default) == "composite implicit"  # becomes t + addmm before DTensor
    assert rules.rule_kind(aten._cdist_forward.default) is None


def test_custom_rule_from_register_sharding(meshes):
    """An op of this test's own, given a rule through register_sharding: the kind is "custom", and
    propagation follows the registered rule (sharded on dim 0 or replicated) as DTensor does at runtime."""
    from torch.distributed.tensor.experimental import register_sharding

    @torch.library.custom_op("colauto_test::double", mutates_args=())
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    double.register_fake(lambda x: torch.empty_like(x))
    op = torch.ops.colauto_test.double.default
    assert rules.rule_kind(op) is None

    @register_sharding(op)
    def _rule(x):
        return [([Replicate()], [Replicate()]), ([Shard(0)], [Shard(0)])]

    assert rules.rule_kind(op) == "custom"
    for pl in [(Shard(1),), (Shard(0),), (Replicate(),)]:
        got = rules.propagate(op, (T(16, 8),), {}, [pl], meshes["1d"])
        assert (got.out, got.redistribute) == run_on_dtensors(op, (T(16, 8),), {}, [pl], meshes["1d"])


def test_op_without_rule_raises_in_dtensor_and_in_propagate(meshes):
    x = T(16, 8)
    with pytest.raises(NotImplementedError):
        run_on_dtensors(aten._cdist_forward.default, (x, x, 2.0, None), {}, [(Replicate(),)] * 2, meshes["1d"])
    with pytest.raises(NotImplementedError, match="_cdist_forward"):
        rules.propagate(aten._cdist_forward.default, (x, x, 2.0, None), {}, [(Replicate(),)] * 2, meshes["1d"])


def test_handler_ops_are_not_predicted(meshes):
    """DTensor's convolution handler (torch 2.11, 2.13) computes on the inputs as given, ignoring the
    redistribution its propagator asks for (a partial weight stays partial): propagate must refuse, not guess."""
    conv = (T(4, 4, 8, 8), T(8, 4, 3, 3), T(8), [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    placements = [(Shard(0),), (Partial(),), (Replicate(),)]
    with pytest.raises(NotImplementedError, match="convolution"):
        rules.propagate(aten.convolution.default, conv, {}, placements, meshes["1d"])


def test_wrong_placement_count_is_one_line(meshes):
    with pytest.raises(ValueError) as err:
        rules.propagate(aten.mm.default, (T(16, 8), T(8, 12)), {}, [(Replicate(),)], meshes["1d"])
    assert "\n" not in str(err.value) and "2 tensor arguments but 1 placements" in str(err.value)


def test_missing_private_api_is_one_line(monkeypatch):
    prop = DTensor._op_dispatcher.sharding_propagator
    monkeypatch.delattr(prop, "op_strategy_funcs")
    rules._dtensor.cache_clear()
    try:
        with pytest.raises(RuntimeError) as err:
            rules.rule_kind(aten.mm.default)
    finally:
        monkeypatch.undo()
        rules._dtensor.cache_clear()
    msg = str(err.value)
    assert "\n" not in msg and "op_strategy_funcs" in msg and "_dtensor_rules.py" in msg


def test_uncovered_names_the_ops_dtensor_refuses(meshes):
    """A traced block with ops DTensor shards directly, one it may reach by decomposition (mse_loss), and
    two it cannot run (cdist; CPU flash attention, unless colauto registered its rule in this process). Reference: each
    op run on replicated DTensors; those that raise NotImplementedError are the uncovered ones."""
    from torch.fx.experimental import _config as fx_config
    from torch.fx.experimental.proxy_tensor import make_fx

    def block(x, w, b):
        h = torch.nn.functional.layer_norm(torch.addmm(b, x, w), (8,))
        q = h.view(2, 2, 2, 8)
        att = aten._scaled_dot_product_flash_attention_for_cpu.default(q, q, q, 0.0, True)[0]
        loss = torch.nn.functional.mse_loss(h, torch.nn.functional.gelu(h))
        return torch.cdist(h, h).sum() + att.sum() + loss

    gm = make_fx(block, tracing_mode="fake")(torch.randn(8, 8), torch.randn(8, 8), torch.randn(8))
    want = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) or str(node.target) in want:
            continue
        args, kwargs = torch.utils._pytree.tree_map_only(torch.fx.Node, lambda a: a.meta["val"],
                                                         (node.args, node.kwargs))
        n = sum(isinstance(t, torch.Tensor) for t in torch.utils._pytree.tree_leaves((args, kwargs)))
        if n == 0:
            continue
        try:
            run_on_dtensors(node.target, args, kwargs, [(Replicate(),)] * n, meshes["1d"])
        except NotImplementedError:
            want.append(str(node.target))
    assert "aten._cdist_forward.default" in want
    assert list(rules.uncovered(gm)) == want
    # a dynamic-shape trace of the same block (sizes are symbols, answered at their example values)
    with fx_config.patch(use_duck_shape=False):
        dynamic = make_fx(block, tracing_mode="symbolic")(torch.randn(8, 8), torch.randn(8, 8), torch.randn(8))
    assert any(isinstance(s, torch.SymInt) for n in dynamic.graph.nodes if n.op == "placeholder"
               for s in n.meta["val"].shape)
    assert list(rules.uncovered(dynamic)) == want


def test_op_without_rule_runs_replicated(meshes):
    """run_replicated gives an op DTensor has no rule for colauto's fallback: whatever its inputs'
    placements (sharded, partial), DTensor gathers them and the output is Replicate, as `propagate`
    predicts; the op stays listed by `uncovered` (its gathers are costed) and its kind is "replicated"."""
    @torch.library.custom_op("colauto_test::scaled", mutates_args=())
    def scaled(x: torch.Tensor, y: torch.Tensor, k: float) -> torch.Tensor:
        return x * y * k

    scaled.register_fake(lambda x, y, k: torch.empty_like(x))
    op = torch.ops.colauto_test.scaled.default
    args = (T(16, 8), T(16, 8), 2.0)
    with pytest.raises(NotImplementedError):
        run_on_dtensors(op, args, {}, [(Shard(0),), (Replicate(),)], meshes["1d"])
    assert rules.replicable(op) and rules.rule_kind(op) is None
    rules.run_replicated(op)
    assert rules.rule_kind(op) == "replicated"
    for pl in [[(Shard(0),), (Shard(1),)], [(Partial(),), (Replicate(),)], [(Replicate(),), (Replicate(),)]]:
        got = rules.propagate(op, args, {}, pl, meshes["1d"])
        assert got.out == ((Replicate(),),)
        assert (got.out, got.redistribute) == run_on_dtensors(op, args, {}, pl, meshes["1d"])
    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda x, y: op(x, y, 2.0), tracing_mode="fake")(
        torch.randn(16, 8), torch.randn(16, 8))
    assert list(rules.uncovered(gm)) == ["colauto_test.scaled.default"]


def test_what_cannot_run_replicated():
    """An op that mutates an input, or takes or returns a tensor list, gets no generic rule."""
    assert not rules.replicable(aten.fill_.Tensor)          # mutates self
    assert not rules.replicable(aten.cat.default)           # Tensor[] input
    assert not rules.replicable(aten.split.Tensor)          # Tensor[] output
    assert rules.replicable(aten.fill.Tensor)
    with pytest.raises(ValueError, match="cannot be run replicated"):
        rules.run_replicated(aten.add_.Tensor)


def test_in_place_variant_keeps_its_placement(meshes):
    """Once `fill.Tensor` runs replicated, DTensor would run the in-place `fill_.Tensor` (which has no
    rule) as fill + copy_ into a gathered copy, and the write would be lost; colauto's handler writes
    the rank's part back: the result is the input itself, in its placement. (Values: the BART tp run
    in tests/test_parallel_data.py, which trains like one process only with it.)"""
    rules.run_replicated(aten.fill.Tensor)
    (x,), _ = on_mesh((T(16, 8),), {}, [(Shard(0),)], meshes["1d"])
    out = aten.fill_.Tensor(x, torch.tensor(2.0, device="meta"))
    assert out is x and x.placements == (Shard(0),)


def test_laid_out_as_copies_only_when_the_order_differs():
    x = torch.randn(2, 8, 4, 16).transpose(1, 2)                  # [b, h, s, d] laid out [b, s, h, d]
    assert rules.laid_out_as(x, x.stride()) is x
    c = x.contiguous()
    got = rules.laid_out_as(c, x.stride())
    assert got.stride() == x.stride() and torch.equal(got, c)
    assert rules.laid_out_as(c, c.stride()) is c
    assert rules.laid_out_as(c, (0, 0, 16, 1)) is c                 # an expanded tensor's strides: left alone
    one = torch.randn(2, 1, 4, 16)                                  # size-one dims are not compared
    assert rules.laid_out_as(one, (64, 1, 16, 1)) is one


def test_redistributed_local_keeps_its_global_layout(meshes, monkeypatch):
    """DTensor keeps a redistributed tensor's global strides, but its collectives return the local tensor
    contiguous; with `keep_local_layout` the local is laid out as the global strides say, so HF attention's
    `transpose(1, 2).reshape(...)` after a query gathered over one axis of a 2-d mesh (Llama under dp x tp)
    stays a view the local tensor can take. (Training: llama@dp=2,tp=2 in tests/test_parallel_data.py.)"""
    import importlib
    for name in rules._REDISTRIBUTE_USERS:       # undone after the test
        module = importlib.import_module(name)
        monkeypatch.setattr(module, "redistribute_local_tensor", module.redistribute_local_tensor)
    rules.keep_local_layout()
    rules.keep_local_layout()                    # idempotent
    assert importlib.import_module(rules._REDISTRIBUTE_USERS[1]).redistribute_local_tensor.__wrapped__ \
        .__name__ == "redistribute_local_tensor"
    mesh = meshes["2d"]
    local = torch.randn(4, 16, 4, 16).transpose(1, 2)               # the rank's [b, h, s, d] of a [8, 4, 16, 16]
    q = DTensor.from_local(local, mesh, (Shard(0), Replicate()), run_check=False)
    for target in ((Replicate(), Shard(1)), (Replicate(), Replicate()), (Shard(0), Shard(1))):
        moved = q.redistribute(mesh, target)
        assert moved.stride() == q.stride()
        mine = moved.to_local()
        assert rules.laid_out_as(mine, moved.stride()) is mine, (target, mine.stride())
        out = (moved * 2).transpose(1, 2).reshape(8, 16, -1)       # a view of the global layout
        assert out.shape == (8, 16, 64)


# HF's attention masks: [B, 1, q, k] (broadcast over heads, Llama's), per head, and one for the whole batch
MASKS = {"over_heads": (4, 1, 32, 32), "per_head": (4, 8, 32, 32), "whole_batch": (1, 1, 32, 32)}


@pytest.mark.parametrize("mask", list(MASKS))
def test_fused_attention_masks_are_sliced_as_the_query_is(meshes, mask):
    """CUDA's fused attention (run on meta tensors here) under dp x tp: q/k/v batch-sharded over dp and
    head-sharded over tp, the mask made in forward (replicated). DTensor's own cuDNN rule has no entry for
    the mask ("zip() argument 2 is shorter than argument 1": HF Llama 8B under dp=2,tp=2 on 4 H200s), and
    its efficient-attention rule shards a mask that broadcasts over heads on heads, which drops the heads
    strategy and gathers q/k/v over tp. With `shard_attention_masks`, q/k/v stay where they are and only
    the mask moves: along each mesh dim it takes the query's Shard(d) where it has dim d whole, else stays
    replicated (a local slice, no communication), in forward and in backward."""
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor.experimental import implicit_replication
    rules.shard_attention_masks()
    mesh = meshes["2d"]
    shape = MASKS[mask]
    qs, rr = (Shard(0), Shard(1)), (Replicate(), Replicate())
    want = tuple(Shard(d) if shape[d] > 1 else Replicate() for d in (0, 1))
    q, m = T(4, 8, 32, 16, dtype=torch.bfloat16), T(*shape, dtype=torch.bool)
    moved = ((3, rr, want),) if want != rr else ()
    for op in (aten._scaled_dot_product_cudnn_attention.default, aten._scaled_dot_product_efficient_attention.default):
        got = rules.propagate(op, (q, q, q, m, True), {}, [qs, qs, qs, rr], mesh)
        assert got.out[0] == qs and got.out[1] == qs, op
        assert got.redistribute == moved, op
    dq, dm = distribute_tensor(q, mesh, list(qs)), distribute_tensor(m, mesh, list(rr))
    with implicit_replication():
        o, lse, cq, ck, mq, mk, seed, offset, _ = aten._scaled_dot_product_cudnn_attention.default(dq, dq, dq, dm, True)
        grads = aten._scaled_dot_product_cudnn_attention_backward.default(dq, dq, dq, dq, o, lse, seed, offset, dm,
                                                                          cq, ck, mq, mk, 0.0, False)
        assert [g.placements for g in grads] == [qs] * 3
        o, lse, seed, offset = aten._scaled_dot_product_efficient_attention.default(dq, dq, dq, dm, True)
        grads = aten._scaled_dot_product_efficient_attention_backward.default(
            dq, dq, dq, dq, dm, o, lse, seed, offset, 0.0, [True, True, True, False])
        assert [g.placements for g in grads[:3]] == [qs] * 3
        # a float mask that needs a gradient keeps DTensor's own rule; the choice reads grad_input_mask,
        # which must key DTensor's cache (the same tensors with the other mask reused the first's rule)
        bias = distribute_tensor(T(*shape), mesh, list(rr))
        for needs in (False, True, False):
            aten._scaled_dot_product_efficient_attention_backward.default(
                dq, dq, dq, dq, bias, o, lse, seed, offset, 0.0, [True, True, True, needs])


def test_padding_keeps_the_dims_it_does_not_pad_sharded(meshes):
    """HF's loss pads the labels by one position (`F.pad(labels, (0, 1))`), labels batch-sharded over dp
    and tp. Torch 2.11's constant_pad_nd rule is a one-dim stub (its redistribution planner fails with
    "list index out of range" on a 2-D mesh: HF Llama 8B under dp=2,tp=2); `shard_padding` gives 2.11
    torch 2.13's behaviour, and leaves 2.13's own rule in place: a dim the pad leaves alone stays
    sharded, a padded one is gathered."""
    from torch.distributed.tensor import distribute_tensor
    rules.shard_padding()
    labels = distribute_tensor(I(8, 64), meshes["2d"], [Shard(0), Shard(0)])
    out = torch.nn.functional.pad(labels, (0, 1), value=-100)
    assert out.placements == (Shard(0), Shard(0)) and out.shape == (8, 65) and out.to_local().shape == (2, 65)
    out = torch.nn.functional.pad(labels, (0, 0, 1, 0), value=-100)         # pads dim 0, the sharded one
    assert out.shape == (9, 64) and Shard(0) not in out.placements
    # colauto's rule itself (what 2.11 runs): Replicate, or Shard(d) for each dim the pad leaves alone
    spec = SimpleNamespace(shape=(8, 64, 16))
    assert rules._padding(spec, [0, 1], -100) == [([Replicate()], [Replicate(), None, None]),
                                                  ([Shard(0)], [Shard(0), None, None]),
                                                  ([Shard(1)], [Shard(1), None, None])]
    assert [o for o, _ in rules._padding(spec, [0, 0, 2, 0])] == [[Replicate()], [Shard(0)], [Shard(2)]]


def test_batch_norm_backward_is_placed_by_channel_without_tracing_its_decomposition(meshes, monkeypatch):
    """Where DTensor has no BatchNorm-backward rule (2.11; 2.12 derives one by tracing the op's
    decomposition for every placement of its seven tensor inputs: HF ResNet under tp=2 took 940 s in a
    torch 2.12 suite run), `shard_batch_norm_backward` gives torch 2.13's: channel shards stay channel
    shards, with no redistribution. Here 2.13's own rule is taken away and the decomposition path made to
    fail, so the placements come from colauto's rule alone."""
    from torch.distributed.tensor._decompositions import DecompShardingStrategy
    d = rules._dtensor()
    op = aten.native_batch_norm_backward.default
    monkeypatch.delitem(d.prop.op_single_dim_strategy_funcs, op, raising=False)
    monkeypatch.setitem(d.prop.op_strategy_funcs, op, None)      # absent until the rule is registered; as it
    del d.prop.op_strategy_funcs[op]                             # was (absent, on 2.13) after the test
    if op in d.prop.op_to_schema_info:
        monkeypatch.setitem(d.prop.op_to_schema_info, op, d.prop.op_to_schema_info[op])

    def derived(*args, **kwargs):
        raise AssertionError("the BatchNorm backward's placements were derived by tracing its decomposition")
    monkeypatch.setattr(DecompShardingStrategy, "propagate_strategy", derived)
    d.prop.propagate_op_sharding.cache_clear()
    # as the lifted tp graph runs it: without `batch_norm_per_rank`'s handler, which an earlier test in this
    # process may have installed (it runs before any rule)
    try:
        with rules.default_batch_norm():
            rules.shard_batch_norm_backward()
            x, c = T(8, 16, 4, 4), T(16)
            args = (x, x, c, c, c, c, c, True, 1e-5, [True, True, True])
            (dargs, dkwargs) = on_mesh(args, {}, [(Shard(1),), (Shard(1),)] + [(Shard(0),)] * 5, meshes["1d"])
            grad_input, grad_weight, grad_bias = op(*dargs, **dkwargs)
            assert grad_input.placements == (Shard(1),) and grad_input.to_local().shape == (8, 4, 4, 4)
            assert grad_weight.placements == grad_bias.placements == (Shard(0),)
            assert grad_weight.to_local().shape == (4,)
            # weight and statistics replicated (a replicated BatchNorm's): the batch-sized tensors stay whole
            (dargs, dkwargs) = on_mesh(args, {}, [(Replicate(),)] * 7, meshes["1d"])
            assert all(t.placements == (Replicate(),) for t in op(*dargs, **dkwargs))
    finally:
        d.prop.propagate_op_sharding.cache_clear()


def test_batch_norm_backward_rule_lists_whole_and_channel_placements():
    # the rule itself: everything whole, or channels split (absent optional tensors stay None)
    spec4, spec1 = SimpleNamespace(shape=(8, 16, 4, 4)), SimpleNamespace(shape=(16,))
    whole, channel = rules._by_channel(spec4, spec4, spec1, None, None, spec1, spec1, True, 1e-5, [True] * 3)
    assert channel == ([Shard(1), Shard(0), Shard(0)], [Shard(1), Shard(1), Shard(0), None, None, Shard(0), Shard(0),
                                                       None, None, None])
    assert whole[1][:4] == [Replicate(), Replicate(), Replicate(), None]


def test_rules_colauto_registers_are_keyed_on_every_argument(meshes):
    """DTensor caches a propagation by the arguments its RuntimeSchemaInfo names; register_sharding names
    the first int argument on, which leaves out an int[] (constant_pad_nd's pad): a second call with
    other sizes got the first call's output shape. Rules colauto registers are keyed on every non-tensor
    argument and every keyword."""
    @torch.library.custom_op("colauto_test::grow", mutates_args=())
    def grow(x: torch.Tensor, extra: list[int]) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, extra[0]))

    grow.register_fake(lambda x, extra: x.new_empty(*x.shape[:-1], x.shape[-1] + extra[0]))
    op = torch.ops.colauto_test.grow.default
    rules._register_sharding(op, lambda x, extra: [([Replicate()], [Replicate(), None]),
                                                  ([Shard(0)], [Shard(0), None])])
    (x,), _ = on_mesh((T(8, 16),), {}, [(Shard(0), Shard(0))], meshes["2d"])
    assert op(x, [1]).shape == (8, 17)
    assert op(x, [3]).shape == (8, 19)


def test_a_collective_of_a_convolution_gradient_is_found():
    """torch 2.11's all-reduce and reduce-scatter bucketing fail on a convolution weight's gradient that
    Inductor lays out channels-last (HF ViT under dp, HF ResNet under fsdp on the captured graph, codegen
    inductor, on 2.11: "Cannot view a tensor with shape [64, 3, 8, 8] and strides (192, 1, 24, 3)"); there
    colauto leaves that graph's collectives of that kind unbucketed (counted). The check finds such a
    collective through getitem, the averaging division and the padding to equal pieces, and no other."""
    from colauto_backend import _torch_compat as compat
    def graph(source, collective):
        g = torch.fx.Graph()
        x, w = g.placeholder("x"), g.placeholder("w")
        grads = g.call_function(source, (x, w))
        grad = g.call_function(operator.getitem, (grads, 1)) if source is aten.convolution_backward.default else grads
        if collective == "all_reduce":
            avg = g.call_function(aten.div.Tensor, (grad, 2))
            g.output(g.call_function(torch.ops._c10d_functional.all_reduce.default, (avg, "sum", "0")))
        else:
            padded = g.call_function(aten.constant_pad_nd.default, (grad, [0, 0, 0, 1]))
            g.output(g.call_function(torch.ops._c10d_functional.reduce_scatter_tensor.default, (padded, "sum", 2, "0")))
        return torch.fx.GraphModule(torch.nn.Module(), g)
    for collective, name in (("all_reduce", "bucket_all_reduces_fx"), ("reduce_scatter", "bucket_reduce_scatters_fx")):
        assert compat._bucketing_views_a_convolution_tensor(graph(aten.convolution_backward.default, collective)) == [name]
        assert compat._bucketing_views_a_convolution_tensor(graph(aten.mm.default, collective)) == []
    # the version check against the installed torch's own bucketing code: 2.11 and 2.12 flatten each input
    # with view (what fails on a channels-last gradient), 2.13 with reshape
    import inspect
    from torch._inductor.fx_passes import bucketing
    source = inspect.getsource(bucketing)
    views = "x.view(-1) for x in ar_ins" in source or "x.view(group_size, -1)" in source
    assert views or "x.reshape(-1) for x in ar_ins" in source, "torch's bucketing flattens its inputs another way"
    assert bool(compat._BUCKETING_VIEWS) == views


def test_a_view_of_a_sharded_dim_with_no_rule_runs_gathered(meshes):
    """Heads sharded, then merged with the dims before them by matmul's `_unsafe_view` and a `view` (a lifted tp
    graph: the ranks' stack, T5's batch and heads): DTensor's rules refuse one of the two (torch 2.11: the
    `_unsafe_view` of a sharded dim that is not the first; torch 2.13: the `view` of the strided shard the first
    made, KeyError). With `views_of_strided_shards` the refused one runs on its gathered input, counted once, and
    the result is whole and of the right shape; a view DTensor's rule places is left to it (nothing counted)."""
    mesh = meshes["1d"]
    heads = DTensor.from_local(T(2, 2, 4 // WORLD, 16, 16), mesh, [Shard(2)], run_check=False)
    rules.views_of_strided_shards()
    before = sum(rules.STRIDED_VIEWS_GATHERED.values())
    plain = DTensor.from_local(T(2, 8 // WORLD, 16, 16), mesh, [Shard(1)], run_check=False)
    assert plain.view(2, 8, 256).placements == (Shard(1),) and sum(rules.STRIDED_VIEWS_GATHERED.values()) == before
    flat = aten._unsafe_view(heads, [2, 8, 16, 16]).view(16, 16, 16)
    assert flat.shape == (16, 16, 16) and flat.placements == (Replicate(),) and flat.to_local().shape == (16, 16, 16)
    assert sum(rules.STRIDED_VIEWS_GATHERED.values()) == before + 1, dict(rules.STRIDED_VIEWS_GATHERED)


@pytest.mark.parametrize("mesh_name, placements, expected", [
    ("1d", (Replicate(),), (Replicate(),)),                         # a convolution run replicated over tp
    ("1d", (Shard(0),), (Partial(),)),                              # each rank's part of the batch
    ("2d", (Shard(0), Replicate()), (Partial(), Replicate())),      # dp x tp: batch over dp, whole over tp
])
def test_convolution_weight_gradients_are_partial_only_over_the_mesh_dims_that_shard_the_input(
        meshes, mesh_name, placements, expected):
    """convolution_backward run on DTensors (DTensor's convolution handler) gives weight and bias gradients
    that are Partial (a part of the sum) only along the mesh dims that shard its input, Replicate along the
    others: every rank there computed the whole gradient. Torch 2.11's rule said Partial over mesh dim 0
    whatever the input, and HF ConvNeXt under tp=2 trained with its convolution gradients doubled; colauto
    replaces that rule there (`convolution_weight_grads_replicated_where_the_input_is`; a no-op where
    DTensor has its own strategy, as on 2.13, where this checks DTensor's)."""
    rules.convolution_weight_grads_replicated_where_the_input_is()
    mesh = meshes[mesh_name]
    # a patchifying convolution (ConvNeXt's stem): torch 2.11's handler takes only stride == kernel size
    g, x, w = T(8, 16, 2, 2), T(8, 3, 8, 8), T(16, 3, 4, 4)
    args = (g, x, w, [16], [4, 4], [0, 0], [1, 1], False, [0, 0], 1, [True, True, True])
    dargs, dkwargs = on_mesh(args, {}, [placements, placements, (Replicate(),) * mesh.ndim], mesh)
    grad_input, grad_weight, grad_bias = aten.convolution_backward.default(*dargs, **dkwargs)
    assert tuple(grad_input.placements) == placements
    assert tuple(grad_weight.placements) == expected and tuple(grad_bias.placements) == expected


def test_a_gathered_convolution_weight_is_found():
    """torch 2.11's all-gather bucketing hands a convolution its gathered weight or bias as views of the
    bucket, which 2.11's convolution lowering rejects ("NotImplementedError: View": HF ViT and ConvNeXt under
    fsdp=2 with codegen inductor); there colauto leaves that graph's all-gathers unbucketed. The check finds a
    gather read by a convolution as its weight or bias through the wait, narrow, view and clone between
    them, and not one read by a matmul or as the convolution's input."""
    from colauto_backend import _torch_compat as compat

    def graph(reader, position):
        g = torch.fx.Graph()
        x, shard = g.placeholder("x"), g.placeholder("shard")
        full = g.call_function(torch.ops._c10d_functional.all_gather_into_tensor.default, (shard, 2, "0"))
        full = g.call_function(torch.ops._c10d_functional.wait_tensor.default, (full,))
        w = g.call_function(aten.narrow.default, (full, 0, 0, 16))
        w = g.call_function(aten.clone.default, (g.call_function(aten.view.default, (w, [16, 3, 4, 4])),))
        args = [x, w, None, [4, 4], [0, 0], [1, 1], False, [0, 0], 1] if position == "weight" else \
            [w, x, None, [4, 4], [0, 0], [1, 1], False, [0, 0], 1]
        g.output(g.call_function(reader, tuple(args) if reader is aten.convolution.default else (x, w)))
        return torch.fx.GraphModule(torch.nn.Module(), g)
    assert compat._bucketing_views_a_convolution_tensor(graph(aten.convolution.default, "weight")) == ["bucket_all_gathers_fx"]
    assert compat._bucketing_views_a_convolution_tensor(graph(aten.convolution.default, "input")) == []
    assert compat._bucketing_views_a_convolution_tensor(graph(aten.mm.default, "weight")) == []


@pytest.mark.parametrize("mesh_name", ["1d", "2d"])
@pytest.mark.parametrize("dim", [0, 2])
def test_index_put_is_never_sharded_on_a_dim_an_index_selects(meshes, mesh_name, dim):
    """The backward of a gather lifted over the ranks (HF Qwen2-MoE's experts indexed by each rank's routing
    under tp): index_put of zeros [4, 64, 64] on dims 0 and 1 by indices [4, 1] and [4, 64], values
    [4, 64, 64]. Whatever `self` and `values` arrive as, DTensor's choice must not leave them sharded on an
    indexed dim (the indices stay whole: a rank's local positions are not the global ones). Torch 2.11's
    strategy kept both Shard(0): Qwen2-MoE under dp=2,tp=2 failed in its backward ("value tensor of shape
    [2, 64, 64] cannot be broadcast to indexing result of shape [4, 64, 64]"); colauto drops such strategies
    there (`index_put_never_sharded_on_an_indexed_dim`; a no-op on 2.13, where this checks DTensor's)."""
    rules.index_put_never_sharded_on_an_indexed_dim()
    mesh = meshes[mesh_name]
    rest = (Replicate(),) * (mesh.ndim - 1)
    sharded, whole = (Shard(dim), *rest), (Replicate(),) * mesh.ndim
    args = (T(4, 64, 64), [I(4, 1), I(4, 64)], T(4, 64, 64), True)
    got = rules.propagate(aten.index_put.default, args, {}, [sharded, whole, whole, sharded], mesh)
    final = {0: sharded, 3: sharded}
    for i, _, after in got.redistribute:
        final[i] = after
    for placements in (got.out[0], final[0], final[3]):
        assert not any(isinstance(p, Shard) and p.dim < 2 for p in placements), (got, final)
    assert final[0] == final[3] == got.out[0], (got, final)   # the same dims of self, values and the result
