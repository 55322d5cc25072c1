"""Collectives that overlap compute: a wait moved to where its result is first needed.

DTensor's redistributions trace each collective with its wait right after it (the result is used by the
next op, often only a division or a view on the way to the graph's outputs). Inductor keeps that order
(its overlap passes are off, or empty lists, by default in torch 2.11-2.13), so on 4 H200s HF Llama-3-8B's
backward waited for every gradient all-reduce at once: 198 ms of collectives in a 442 ms step, none of
it under compute. `sink_waits` moves each wait whose downstream work is light (views, elementwise ops,
waits; no further collective, which must start where it is) and feeds only the graph's outputs to just
before the output: the
collective then runs while the rest of the graph computes, as DDP's buckets and colauto's own data
parallelism (`data.reduce_gradients`) do. A wait some later compute needs stays where it is.

`bucket_all_reduces` then merges the sunk all-reduces of one group, in the order the graph produces
their inputs, into flat buckets of about BUCKET_BYTES (DDP's 25 MB): one collective per bucket, issued
as soon as its last input exists, waited for at the end. A gradient of BUCKET_BYTES or more stays its
own collective (merged, it would only be copied). Inductor's own bucketing (bucket_all_reduces_fx)
puts each bucket's wait right after its collective and merges waits that sit side by side, so on sunk
waits it would make one late, unoverlapped collective of the whole graph's gradients; `run_with_inductor`
leaves it off where this pass ran.

`prefetch_gathers` runs first: a sharded parameter's all-gather (fsdp) depends only on the graph's
inputs, but DTensor traces it right before its first use, so each one ran alone (on 4 H200s, HF
Llama-3-8B at T=8192 under fsdp=4: 13 bucketed gathers, ~70 ms a step with no compute beside them).
Each is now issued up to PREFETCH_BYTES of gathers ahead of its use (FSDP2 prefetches one layer), its
wait left where it was; Inductor's all-gather bucketing, which would merge the early gathers into one
waited at the first use, stays off where this pass moved any.

On CPU tensors (the gloo backend) none of this runs: each collective stays where DTensor traced it, waited
before the next one starts (`schedule_collectives`' `keep_order`). ProcessGroupGloo runs a group's
collectives on two worker threads, and several all-gathers of one group in flight corrupt the heap
(glibc's "malloc(): unaligned tcache chunk detected", SIGABRT). `python -m bench.gloo_race` reproduces
it without colauto: 64 all-gathers in flight on one group of 4 ranks aborted within 100-280 s, the same
all-gathers each waited before the next ran 240 s clean, and so did 64 all-reduces in flight
(bench/results/cpu-2026-12-02-gloo-race/). The likely cause, from ProcessGroupGloo's source: `runLoop`
writes the group's status (`lastCompletedWorkName`, a heap string for "ALLGATHER_COALESCED") outside
its lock; "ALLREDUCE" fits the string's inline buffer. Prefetched gathers took 1 in 32 of the 4-rank
fsdp=2,tp=2 test runs down this way (CI failed on it twice in a row).
"""
from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx as fx

from .. import _torch_compat as compat
from .. import counters

SUNK = counters.counter("collective waits moved to the end of their graph (overlapping compute)")
KEPT = counters.counter("graphs whose collectives keep their traced order (CPU tensors: gloo)")
WAIT = torch.ops._c10d_functional.wait_tensor.default
ALL_REDUCE = torch.ops._c10d_functional.all_reduce.default
ALL_GATHER = torch.ops._c10d_functional.all_gather_into_tensor.default
BUCKET_BYTES = 25 * 2**20
# gathered bytes in flight (issued, not yet used) at most: about one decoder layer of an 8B model in
# fp32 (0.87 GB), so a layer's gathers run under the previous layer's compute, as FSDP2's prefetch does
PREFETCH_BYTES = 2**30
aten = torch.ops.aten


def _light(node: fx.Node) -> bool:
    """An op that costs about its output's bytes: what may run late without delaying compute."""
    if node.op != "call_function":
        return False
    target = node.target
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if target.namespace == "_c10d_functional":   # a wait; a collective after it must start where it is
        return target is WAIT
    if target._schema.is_mutable:
        return False
    if torch.Tag.pointwise in target.tags or torch.Tag.view_copy in target.tags:
        return True
    returns = target._schema.returns
    return bool(returns) and returns[0].alias_info is not None or target in _COPIES


_COPIES = {torch.ops.aten._to_copy.default, torch.ops.aten.clone.default, torch.ops.aten._unsafe_view.default,
           torch.ops.aten.view.default, torch.ops.aten.reshape.default}


def _rewritten(gm: fx.GraphModule, changes: int, counter: str, graphs: bool = False) -> int:
    """After a pass changed `changes` things in `gm` (0: nothing): check and regenerate it, count them."""
    if changes:
        gm.graph.lint()
        gm.recompile()
        SUNK[counter] += changes
        if graphs:
            SUNK["graphs"] += 1
    return changes


def merge_duplicate_waits(gm: fx.GraphModule) -> int:
    """Give each collective one wait: a second `wait_tensor` of the same collective is replaced by the
    first (waiting is idempotent, and the first precedes every use of the second). DTensor's traced
    collectives can be waited once per use (HF ResNet's BatchNorm statistics under tp: the averaged
    running mean read by the buffer's write and the output), and Inductor's collective bucketing asserts
    a single wait ("Expected single user for all_reduce_13"). Returns how many waits went (counted)."""
    first: dict[fx.Node, fx.Node] = {}
    merged = 0
    for node in list(gm.graph.find_nodes(op="call_function", target=WAIT)):
        source = node.args[0]
        if source not in first:
            first[source] = node
            continue
        node.replace_all_uses_with(first[source])
        gm.graph.erase_node(node)
        merged += 1
    return _rewritten(gm, merged, "duplicate waits of one collective merged")


def sink_waits(gm: fx.GraphModule) -> int:
    """Move each collective's wait, with the light ops that follow it, to just before the output, where
    nothing but the outputs depends on them; returns how many waits moved (also counted in SUNK)."""
    graph = gm.graph
    output = graph.find_nodes(op="output")[0]
    moved = 0
    order = {n: i for i, n in enumerate(graph.nodes)}
    for wait in list(graph.find_nodes(op="call_function", target=WAIT)):
        if wait.next is output:
            continue
        downstream, stack, ok = {wait}, [wait], True
        while stack and ok:
            for user in stack.pop().users:
                if user is output or user in downstream:
                    continue
                if not _light(user):
                    ok = False
                    break
                downstream.add(user)
                stack.append(user)
        if not ok:
            continue
        for node in sorted(downstream, key=order.__getitem__):
            output.prepend(node)
        moved += 1
    return _rewritten(gm, moved, "waits", graphs=True)


def _input_chain(node: fx.Node) -> set[fx.Node] | None:
    """The nodes `node` depends on back to the graph's inputs, if all are light (casts, views of a
    parameter shard; none where DTensor's gather reads the shard itself); None if it depends on compute
    (an activation's gather)."""
    chain, stack = set(), list(node.all_input_nodes)
    while stack:
        n = stack.pop()
        if n.op in ("placeholder", "get_attr") or n in chain:
            continue
        if not _light(n) or n.target is WAIT:
            return None
        chain.add(n)
        stack.extend(n.all_input_nodes)
    return chain


def _starts_collective(node: fx.Node) -> bool:
    target = getattr(node, "target", None)
    return (node.op == "call_function" and isinstance(target, torch._ops.OpOverload)
            and target.namespace == "_c10d_functional" and target is not WAIT)


def prefetch_gathers(gm: fx.GraphModule, cap: int = PREFETCH_BYTES) -> int:
    """Issue each all-gather of graph inputs (a sharded parameter) before the wait of the earliest
    earlier gather j such that the gathers after j, up to and including this one, hold at most `cap`
    bytes (in the order of their waits); its wait stays where it is. A gather never moves ahead of
    another collective: every rank must issue its collectives in one order, and a rank's graph can
    differ from another's (an uneven shard is padded on one rank only), so the order must not depend on
    which gathers a rank could move. Returns how many gathers moved (also counted in SUNK)."""
    graph = gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    gathers = []          # (gather, its input chain, its wait, gathered bytes), in the order of the waits
    for g in graph.find_nodes(op="call_function", target=ALL_GATHER):
        wait = next(iter(g.users)) if len(g.users) == 1 else None
        chain = _input_chain(g)
        val = g.meta.get("val")
        if wait is None or wait.target is not WAIT or chain is None or not isinstance(val, torch.Tensor):
            continue
        gathers.append((g, chain, wait, val.numel() * val.element_size()))
    gathers.sort(key=lambda t: order[t[2]])
    moved, j, ahead = 0, 0, 0       # ahead: bytes of gathers j+1..i
    for i, (g, chain, _, nbytes) in enumerate(gathers):
        ahead += nbytes if i > j else 0
        while j < i and ahead > cap:
            j += 1
            ahead -= gathers[j][3]
        if j == i:
            continue
        # walk back from the gather to the anchor (an earlier gather's wait: waits never move), stopping
        # after the first other collective on the way
        anchor, chained, passed = gathers[j][2], chain, []
        node = g.prev
        while node is not anchor and node.op != "root" and not (_starts_collective(node) and node not in chained):
            passed.append(node)
            node = node.prev
        if node.op == "root":
            continue
        target = anchor if node is anchor else node.next
        to_move = [n for n in reversed(passed) if n in chained] + [g]
        if not any(n not in chained for n in passed):      # nothing but its own chain between: in place
            continue
        for n in to_move:
            target.prepend(n)
        moved += 1
    return _rewritten(gm, moved, "gathers prefetched", graphs=True)


@dataclasses.dataclass
class Scheduled:
    """What `schedule_collectives` did to one graph (COLAUTO_REPORT prints it)."""
    graph: str
    waits_moved: int
    all_reduces_bucketed: int
    buckets: int
    gathers_prefetched: int = 0
    kept_in_order: bool = False    # CPU tensors (gloo): nothing moved, and Inductor reorders nothing either


def on_cpu(gm: fx.GraphModule) -> bool:
    """Whether `gm`'s collectives run on CPU tensors (the gloo backend): read from their values, or where
    none has one, from the graph's first tensor input."""
    vals = [n.meta.get("val") for n in gm.graph.nodes if _starts_collective(n)]
    vals = [v for v in vals if isinstance(v, torch.Tensor)] or [
        v for n in gm.graph.find_nodes(op="placeholder") if isinstance(v := n.meta.get("val"), torch.Tensor)][:1]
    return any(v.device.type == "cpu" for v in vals)


def schedule_collectives(gm: fx.GraphModule, kind: str = "graph", *, keep_order: bool | None = None) -> Scheduled | None:
    """`prefetch_gathers`, `sink_waits`, then `bucket_all_reduces`; None where nothing moved (the graph
    keeps Inductor's bucketing), else what changed (where waits moved, the graph has its own all-reduce
    buckets and Inductor's must stay off; where gathers moved, Inductor's gather bucketing).
    `keep_order` (None: `on_cpu(gm)`, see the module docstring): nothing moves, and the result, counted
    in KEPT, says so (Inductor's compute/communication reordering must stay off too)."""
    merge_duplicate_waits(gm)
    if on_cpu(gm) if keep_order is None else keep_order:
        if not any(_starts_collective(n) for n in gm.graph.nodes):
            return None
        KEPT[kind] += 1
        return Scheduled(kind, 0, 0, 0, 0, kept_in_order=True)
    prefetched = prefetch_gathers(gm)
    moved = sink_waits(gm)
    if not moved and not prefetched:
        return None
    before = len(gm.graph.find_nodes(op="call_function", target=ALL_REDUCE))
    merged = bucket_all_reduces(gm) if moved else 0
    after = len(gm.graph.find_nodes(op="call_function", target=ALL_REDUCE))
    return Scheduled(kind, moved, merged, merged - (before - after) if merged else 0, prefetched)


def bucket_all_reduces(gm: fx.GraphModule, cap: int = BUCKET_BYTES) -> int:
    """Merge the all-reduces whose waits sit at the end of the graph into buckets of about `cap` bytes
    (one group, reduce op and dtype each); returns how many collectives the buckets replaced."""
    graph = gm.graph
    output = graph.find_nodes(op="output")[0]
    tail = set()
    node = output.prev
    while node.op != "root" and _light(node):     # the block sink_waits left before the output
        tail.add(node)
        node = node.prev
    order = {n: i for i, n in enumerate(graph.nodes) if n in tail}   # the tail's nodes keep their order
    open_buckets: dict[tuple, list[fx.Node]] = {}
    sizes: dict[tuple, int] = {}
    merged = 0

    def close(key):
        nonlocal merged
        members = open_buckets.pop(key, [])
        sizes.pop(key, None)
        if len(members) > 1:
            _merge(graph, members, order)
            merged += len(members)

    for node in list(graph.nodes):
        if node.target is not ALL_REDUCE or node in tail or len(node.users) != 1:
            continue
        wait = next(iter(node.users))
        val = node.meta.get("val")
        if wait.target is not WAIT or wait not in tail or not isinstance(val, torch.Tensor):
            continue
        key = (node.args[1], node.args[2], val.dtype, val.device)
        nbytes = val.numel() * val.element_size()
        if nbytes >= cap:      # big enough alone: merging would only copy it (twice its bytes held at once)
            close(key)
            continue
        open_buckets.setdefault(key, []).append(node)
        sizes[key] = sizes.get(key, 0) + nbytes
        if sizes[key] >= cap:
            close(key)
    for key in list(open_buckets):
        close(key)
    return _rewritten(gm, merged, "all-reduces bucketed")


def _merge(graph: fx.Graph, members: list[fx.Node], order: dict[fx.Node, int]) -> None:
    """One all-reduce of the members' flattened inputs, issued where the last member was; its wait and
    the split back into each member's shape where the first member's wait was (in the graph's tail)."""
    last = members[-1]
    ins = [m.args[0] for m in members]
    shapes = [m.meta["val"].shape for m in members]
    numels = [m.meta["val"].numel() for m in members]
    with graph.inserting_before(last):
        flats = [_call(graph, aten.reshape.default, (x, [-1]), last) for x in ins]
        flat = _call(graph, aten.cat.default, (flats,), last)
        start = _call(graph, ALL_REDUCE, (flat, *last.args[1:]), last)
    waits = [next(iter(m.users)) for m in members]
    with graph.inserting_before(min(waits, key=order.__getitem__)):   # before all that uses a member's result
        done = _call(graph, WAIT, (start,), last)
        offset = 0
        for member, wait, shape, numel in zip(members, waits, shapes, numels):
            piece = _call(graph, aten.slice.Tensor, (done, 0, offset, offset + numel), last)
            view = _call(graph, aten.view.default, (piece, list(shape)), last)
            offset += numel
            wait.replace_all_uses_with(view)
    for member, wait in zip(members, waits):    # after the inserts: the first wait was their insertion point
        graph.erase_node(wait)
        graph.erase_node(member)


def _call(graph: fx.Graph, target, args: tuple, like: fx.Node) -> fx.Node:
    """A new node with its fake value (computed from its inputs' values) and `like`'s other metadata."""
    node = graph.call_function(target, args)
    node.meta.update({k: v for k, v in like.meta.items() if k not in ("val", "tensor_meta")})
    node.meta["val"] = compat.fake_call(target, *fx.node.map_arg(args, lambda n: n.meta["val"]))
    return node
