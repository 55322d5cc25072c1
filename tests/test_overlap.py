"""parallel.overlap: collective waits moved to the end of the graph and all-reduces bucketed, checked on
graphs traced by make_fx and run on a one-rank gloo group (an all-reduce of one rank is the identity, so
the rewritten graph must give eager's values exactly, bucket splits and views included)."""
import os

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from colauto_backend.parallel import overlap

c10d = torch.ops._c10d_functional


def _trace(f, *args):
    return make_fx(f, tracing_mode="fake")(*args)


def _order(gm):
    return {n: i for i, n in enumerate(gm.graph.nodes)}


def _mms(gm):
    return gm.graph.find_nodes(op="call_function", target=torch.ops.aten.mm.default)


def test_gradient_waits_move_after_the_compute_and_values_stay_eager(group):
    def step(x, w1, w2, w3):
        g1 = x.t() @ (x @ w1)                       # a "gradient", reduced at once
        r1 = c10d.wait_tensor(c10d.all_reduce(g1, "sum", group)) / 2
        h = torch.relu(x @ w2) @ w3                 # later compute that does not need r1
        g2 = x.t() @ h
        r2 = c10d.wait_tensor(c10d.all_reduce(g2, "sum", group)) / 2
        return r1, r2, h.sum()

    args = [torch.randn(8, 4), torch.randn(4, 4), torch.randn(4, 6), torch.randn(6, 4)]
    gm = _trace(step, *args)
    expected = step(*args)
    assert overlap.sink_waits(gm) == 2
    order = _order(gm)
    last_mm = max(order[n] for n in _mms(gm))
    waits = gm.graph.find_nodes(op="call_function", target=c10d.wait_tensor.default)
    assert all(order[w] > last_mm for w in waits)
    # each collective still starts where its input is ready: before the compute that follows it
    starts = gm.graph.find_nodes(op="call_function", target=c10d.all_reduce.default)
    assert min(order[s] for s in starts) < last_mm
    for got, want in zip(gm(*args), expected):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_wait_later_compute_needs_stays_and_a_chained_collective_starts_in_place(group):
    def step(x, w):
        a = c10d.wait_tensor(c10d.all_reduce(x @ w, "sum", group))   # the next mm needs it
        b = a @ w.t()
        c = c10d.wait_tensor(c10d.all_reduce(b, "sum", group))
        d = c10d.wait_tensor(c10d.all_reduce(c * 2, "sum", group))   # a collective fed by a wait
        return d + 1

    args = [torch.randn(4, 4), torch.randn(4, 4)]
    gm = _trace(step, *args)
    expected = step(*args)
    before = _order(gm)
    first_wait = next(iter(gm.graph.find_nodes(op="call_function", target=c10d.wait_tensor.default)))
    assert overlap.sink_waits(gm) == 1            # only the last wait: the others feed an mm or a collective
    order = _order(gm)
    assert order[first_wait] - order[first_wait.args[0]] == before[first_wait] - before[first_wait.args[0]]
    torch.testing.assert_close(gm(*args), expected, rtol=0, atol=0)


def test_all_reduces_merge_into_buckets_of_the_cap_in_production_order(group):
    sizes = [(64, 64), (8,), (32, 16), (64, 64), (3, 5), (100,)]   # float32 bytes: 16384, 32, 2048, 16384, 60, 400
    cap = 16384 + 32 + 1       # a bucket closes once it holds at least the cap

    def step(*ws):
        outs = []
        for w in ws:
            outs.append(c10d.wait_tensor(c10d.all_reduce(w * 3, "sum", group)).div(2))
        return outs

    args = [torch.randn(s) for s in sizes]
    gm = _trace(step, *args)
    expected = step(*args)
    # keep_order=False: the passes as a GPU graph gets them (a CPU graph keeps its order: below)
    assert overlap.schedule_collectives(_trace(step, *args), keep_order=False) == overlap.Scheduled("graph", 6, 6, 1)  # 25 MB: one
    assert overlap.sink_waits(gm) == len(sizes)
    # by hand: 16384 + 32 < cap, + 2048 reaches it -> a bucket of 3; 16384 + 60 reaches it -> a bucket of 2;
    # the 400 bytes left alone stay one all-reduce
    assert overlap.bucket_all_reduces(gm, cap=cap) == 5
    assert list(reversed(gm.graph.nodes)) == list(gm.graph.nodes)[::-1]    # the node list is whole both ways
    starts = gm.graph.find_nodes(op="call_function", target=c10d.all_reduce.default)
    assert sorted(s.meta["val"].numel() for s in starts) == sorted([64 * 64 + 8 + 32 * 16, 64 * 64 + 15, 100])
    order = _order(gm)
    output = gm.graph.find_nodes(op="output")[0]
    for s in starts:
        (wait,) = s.users
        assert order[wait] > max(order[n] for n in gm.graph.nodes if n.target is torch.ops.aten.mul.Tensor)
        assert order[s] < order[output]
    for got, want in zip(gm(*args), expected):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_gradient_as_big_as_the_cap_stays_alone_and_closes_the_open_bucket(group):
    sizes = [(4,), (8,), (64, 64), (2,), (3,)]     # bytes 16, 32, 16384, 8, 12; cap 1024

    def step(*ws):
        return [c10d.wait_tensor(c10d.all_reduce(w + 1, "sum", group)) * 2 for w in ws]

    args = [torch.randn(s) for s in sizes]
    gm = _trace(step, *args)
    expected = step(*args)
    overlap.sink_waits(gm)
    # by hand: [16, 32] closes when the 16384-byte one comes (which stays alone), then [8, 12]
    assert overlap.bucket_all_reduces(gm, cap=1024) == 4
    starts = gm.graph.find_nodes(op="call_function", target=c10d.all_reduce.default)
    assert [s.meta["val"].numel() for s in starts] == [4 + 8, 64 * 64, 2 + 3]
    assert starts[1].args[0].target is torch.ops.aten.add.Tensor      # the big one is its own input, uncopied
    for got, want in zip(gm(*args), expected):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_graph_without_collectives_is_left_alone():
    gm = _trace(lambda x, w: (x @ w).relu(), torch.randn(2, 2), torch.randn(2, 2))
    code = gm.code
    assert overlap.schedule_collectives(gm) is None
    assert gm.code == code


def _gather_step(group, *sizes):
    """x @ w for each parameter shard w, gathered (one rank: the identity) right before its use, as
    DTensor traces an fsdp-sharded layer."""
    def step(x, *shards):
        h = x
        for w in shards:
            h = torch.relu(h @ c10d.wait_tensor(c10d.all_gather_into_tensor(w, 1, group)))
        return h.sum()
    args = [torch.randn(4, sizes[0][0])] + [torch.randn(s) for s in sizes]
    return step, args


def test_parameter_gathers_are_issued_up_to_the_cap_ahead_and_values_stay_eager(group):
    sizes = [(8, 8)] * 5                 # 256 bytes each
    step, args = _gather_step(group, *sizes)
    gm = _trace(step, *args)
    expected = step(*args)
    gathers = gm.graph.find_nodes(op="call_function", target=c10d.all_gather_into_tensor.default)
    waits = [next(iter(g.users)) for g in gathers]
    # cap 512: gather i goes before wait j, the earliest j whose later gathers up to i (i - j of them,
    # 256 bytes each) hold at most 512 bytes: j = i - 2, or wait 0 for gather 1 (gather 0 stays)
    assert overlap.prefetch_gathers(gm, cap=512) == 4
    order = _order(gm)
    for i in range(1, 5):
        j = max(i - 2, 0)
        assert order[waits[j - 1] if j >= 1 else gathers[0]] < order[gathers[i]] < order[waits[j]]
    mms = sorted(_mms(gm), key=order.__getitem__)
    assert all(order[w] < order[m] for w, m in zip(waits, mms))      # each wait still before its use
    assert [order[g] for g in gathers] == sorted(order[g] for g in gathers)   # issued in the order of use
    torch.testing.assert_close(gm(*args), expected, rtol=0, atol=0)


def test_a_gather_larger_than_the_cap_or_of_computed_values_stays(group):
    step, args = _gather_step(group, (8, 8), (8, 8))
    gm = _trace(step, *args)
    assert overlap.prefetch_gathers(gm, cap=255) == 0      # each gather alone exceeds the cap

    def activations(x, w):
        h = c10d.wait_tensor(c10d.all_gather_into_tensor(x @ w, 1, group))   # depends on compute
        return (h @ w).sum()
    gm = _trace(activations, torch.randn(4, 4), torch.randn(4, 4))
    code = gm.code
    assert overlap.prefetch_gathers(gm, cap=1 << 30) == 0
    assert gm.code == code


def test_schedule_collectives_reports_prefetched_gathers(group):
    step, args = _gather_step(group, (8, 8), (8, 8), (8, 8))
    gm = _trace(step, *args)
    assert overlap.schedule_collectives(gm, "forward", keep_order=False) == overlap.Scheduled("forward", 0, 0, 0, 2)


def test_collectives_on_cpu_tensors_keep_their_order_and_are_counted(group):
    """On CPU (gloo) nothing moves: two all-gathers of one gloo group in flight at once corrupt the heap
    (bench/gloo_race.py). The same graphs as above, which move on any other device, are left as traced."""
    step, args = _gather_step(group, (8, 8), (8, 8), (8, 8))
    gm = _trace(step, *args)
    code, kept = gm.code, overlap.KEPT["forward"]
    assert overlap.on_cpu(gm)
    assert overlap.schedule_collectives(gm, "forward") == overlap.Scheduled("forward", 0, 0, 0, 0, kept_in_order=True)
    assert gm.code == code and overlap.KEPT["forward"] == kept + 1
    # collectives with no recorded value (a pass that added them without one): the inputs' device decides
    starts = [n for n in gm.graph.nodes if n.target is c10d.all_gather_into_tensor.default]
    saved = [n.meta.pop("val") for n in starts]
    assert overlap.on_cpu(gm)
    for n, v in zip(starts, saved):
        n.meta["val"] = v
    # and on another device's tensors (the same graph with its values moved to meta) the passes run
    for node in gm.graph.nodes:
        if isinstance(node.meta.get("val"), torch.Tensor):
            node.meta["val"] = torch.empty_like(node.meta["val"], device="meta")
    assert not overlap.on_cpu(gm)
    assert overlap.schedule_collectives(gm, "forward") == overlap.Scheduled("forward", 0, 0, 0, 2)


def test_a_gather_never_moves_ahead_of_another_collective(group):
    """Every rank must issue its collectives in one order, whatever each rank's graph let it move: a
    gather is issued early only up to the collective before it."""
    def step(x, w0, w1, w2):
        h = torch.relu(x @ c10d.wait_tensor(c10d.all_gather_into_tensor(w0, 1, group)))
        h = c10d.wait_tensor(c10d.all_reduce(h, "sum", group))            # an activation's collective
        h = torch.relu(h @ c10d.wait_tensor(c10d.all_gather_into_tensor(w1, 1, group)))
        return (h @ c10d.wait_tensor(c10d.all_gather_into_tensor(w2, 1, group))).sum()

    args = [torch.randn(4, 8)] + [torch.randn(8, 8) for _ in range(3)]
    gm = _trace(step, *args)
    expected = step(*args)
    starts = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in (
        c10d.all_gather_into_tensor.default, c10d.all_reduce.default)]
    # w1's and w2's gathers move up to just after the all-reduce (ahead of its wait), not ahead of it
    assert overlap.prefetch_gathers(gm, cap=1 << 20) == 2
    order = _order(gm)
    assert sorted(starts, key=order.__getitem__) == starts          # the collectives keep their order
    assert [order[n] - order[starts[1]] for n in starts[2:]] == [1, 2]
    assert order[starts[3]] < order[next(iter(starts[1].users))]   # before the all-reduce's wait
    torch.testing.assert_close(gm(*args), expected, rtol=0, atol=0)


def test_a_collective_waited_twice_keeps_one_wait_and_eagers_values(group):
    """DTensor's traced collectives can be waited once per use; Inductor's bucketing asserts one wait
    ("Expected single user for all_reduce_13", HF ResNet under tp and fsdp with codegen inductor). The
    second wait goes, its uses read the first; values stay eager's."""
    def step(x, w):
        reduced = c10d.all_reduce(x @ w, "sum", group)
        first = c10d.wait_tensor(reduced) * 2
        second = c10d.wait_tensor(reduced) + 1
        return first, second

    args = [torch.randn(8, 4), torch.randn(4, 4)]
    gm = _trace(step, *args)
    expected = step(*args)
    waits = lambda: gm.graph.find_nodes(op="call_function", target=c10d.wait_tensor.default)  # noqa: E731
    assert len(waits()) == 2
    merged = overlap.SUNK["duplicate waits of one collective merged"]
    assert overlap.merge_duplicate_waits(gm) == 1
    assert len(waits()) == 1 and overlap.SUNK["duplicate waits of one collective merged"] == merged + 1
    assert overlap.merge_duplicate_waits(gm) == 0          # one wait per collective: nothing left to merge
    for got, want in zip(gm(*args), expected):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
