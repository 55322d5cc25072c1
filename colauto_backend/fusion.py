"""COLAUTO_CODEGEN=triton: the fusible regions of a planned aten graph, each run as one generated kernel.

A region is a connected set of nodes that triton_kernels lowers (pointwise ops, last-dim row
reductions: softmax, LayerNorm, RMSNorm and their backwards, and the views between them), with at
least two that compute, or a lone op aten runs slowly (LayerNorm backward, sums: `_SLOW_IN_ATEN`). A
lone cast is not worth a kernel call's CPU cost (the H100 profiles of GPT-2 355M showed the step
waiting on the CPU) unless the graph is replayed as a CUDA graph (`lone_ops`). Sums over every dim but
the last (bias gradients, LayerNorm's weight and bias gradients) are column regions
(triton_kernels.colwise); matmuls, attention and collectives stay aten. Exact rewrites run first
(fusion_prep, rotate_halves: RoPE's cat, expands, short middle-dim sums, LayerNorm backwards split in a
row part and a column part). Nodes then join greedily in graph order: a node joins its producers'
regions (all at once first, then one by one) and then regions that read what it reads, each merge
kept only if one call can compute it (every input ready before any outside reader runs: `_placeable`)
and the generator plans it (checked on the example shapes, remembered by code and sizes). A region
becomes one call of a torch custom op (`colauto::fused_<hash>`) placed where its last node was, or
before the first outside reader that lies between its nodes; where Inductor compiles the graph
afterwards, its re-trace traces into the call (`traceable`) and launches the kernel itself. A region the generator refuses when it
first runs falls back to its aten ops, counted and warned about once: the step still computes the
same thing.
"""
from __future__ import annotations

import dataclasses
import hashlib
import operator
from typing import Callable, NamedTuple

import torch
import torch.fx as fx

import triton_kernels
from triton_kernels import NotFusible

from . import _torch_compat as compat
from . import fusion_prep as prep
from . import counters, report, rotate_halves

FALLBACKS = counters.counter("fusion fallbacks")   # regions run as aten after the generator refused them at run time, by reason
_OPS: dict[str, object] = {}  # custom op name -> op, defined once per process
_PLANS: dict[tuple, bool] = {}  # (region code, input sizes/strides/dtypes/devices) -> whether it plans
_LIB = None
_TRACEABLE: dict[object, Callable] = {}   # custom op -> its body as Inductor may trace it (`traceable`)


@dataclasses.dataclass
class Fusion:
    """What the pass did to one graph (COLAUTO_REPORT prints it)."""
    regions: int = 0
    ops: int = 0                      # aten ops replaced by kernels
    bytes_saved: int = 0              # predicted: intermediates no longer written and read back
    kernels: list[str] = dataclasses.field(default_factory=list)   # custom op names
    unavailable: str | None = None    # why nothing was fused (Triton cannot run here)
    rotations: int = 0                # RoPE half-rotation cats rewritten as pointwise ops (rotate_halves)
    wrapped: int = 0                  # calls Inductor launches from its own wrapper (`traceable`)
    recomputed_left: int = 0          # a plan's recomputed ops left out of the regions (`fuse`'s `recomputed`)

    def add(self, region: list[fx.Node], name: str, saved: int) -> None:
        self.regions += 1
        self.ops += sum(prep.computes(n) for n in region)
        self.bytes_saved += saved
        self.kernels.append(name)


def fuse(gm: fx.GraphModule, lone_ops: bool = False, recomputed: frozenset[str] = frozenset()) -> Fusion:
    """Replace `gm`'s fusible regions in place (each node needs its example value in meta["val"]).
    `lone_ops`: also run each op that joined no region as its own kernel (under CUDA graphs, where a
    call costs no CPU time: aten casts a transposed bf16 weight gradient to fp32 at ~65% of copy).
    `recomputed`: the names of the ops a backward recomputes under a plan. They join no region: they
    run as the memory model has them, each just before its reader (Inductor, or aten in the order the
    partitioner placed them). A region placed where its first reader is would compute them all there:
    HF Llama's recomputed residual stream, a chain of adds over every layer, became one kernel at the
    start of the backward whose 178 outputs were held until each layer's backward read them, 2.5 GiB
    over the modelled peak on an H100 (bench/results/h100-2026-12-06-triton-recompute/)."""
    ok = triton_kernels.available()
    if not ok:
        report.warn_once(f"COLAUTO_CODEGEN=triton: {ok.reason}; the graphs run as aten ops")
        return Fusion(unavailable=ok.reason)
    rotations = rotate_halves.rewrite(gm)
    prep.split_layer_norm_backwards(gm.graph)
    prep.fold_expands(gm.graph)
    prep.unroll_small_sums(gm.graph)
    prep.merge_duplicate_casts(gm.graph)
    prep.copy_shared_casts(gm.graph)
    out = Fusion(rotations=rotations,
                 recomputed_left=sum(n.op == "call_function" and n.name in recomputed and prep.lowerable(n)
                                     for n in gm.graph.nodes))
    for region in _regions(gm.graph, recomputed):
        if _worth_a_kernel(region):
            out.add(region, *_replace(gm, region))
    prep.merge_duplicate_casts(gm.graph)     # the copies of a shared cast that no kernel took become one again
    if lone_ops:
        for node in [n for n in gm.graph.nodes if prep.lowerable(n) and prep.computes(n) and n.name not in recomputed]:
            if isinstance(node.meta["val"], torch.Tensor) and _plans([node]):
                out.add([node], *_replace(gm, [node]))
    gm.graph.lint()
    gm.recompile()
    return out


# ops that a generated kernel runs well enough faster than aten to pay for its call alone (H100 profiles:
# aten's LayerNorm backward kernels at ~60% of copy bandwidth, its bf16 sums over rows at ~40 us each)
_SLOW_IN_ATEN = (torch.ops.aten.native_layer_norm_backward.default, torch.ops.aten.sum.dim_IntList)


def _worth_a_kernel(region: list[fx.Node]) -> bool:
    computing = [n for n in region if prep.computes(n)]
    if len(computing) >= 2:
        return True
    lone_but_slow_in_aten = len(computing) == 1 and computing[0].target in _SLOW_IN_ATEN
    return lone_but_slow_in_aten and _plans(region)     # a region of one node was never checked


def _regions(graph: fx.Graph, left_out: frozenset[str] = frozenset()) -> list[list[fx.Node]]:
    """The graph's lowerable nodes, but those named in `left_out`, grouped greedily in graph order,
    each region in graph order."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    region_of: dict[fx.Node, list[fx.Node]] = {}
    for node in graph.nodes:
        if node in region_of or not prep.lowerable(node) or node.name in left_out:
            continue
        # a tuple-valued op (LayerNorm: out, mean, rstd) moves with the getitems that unpack it
        group = [node] + sorted((u for u in node.users if u.target is operator.getitem), key=order.get)
        if len(group) == 1 and not isinstance(node.meta["val"], torch.Tensor):
            continue
        region = _grown(node, group, region_of, order)
        region_of.update(dict.fromkeys(region, region))
    return list({id(r): r for r in region_of.values()}.values())


def _grown(node: fx.Node, group: list[fx.Node], region_of: dict, order: dict) -> list[fx.Node]:
    """`group` joined with the regions it can merge: its producers' (RMSNorm's backward: a row sum
    broadcast back, and the rows it scales, meet here), all at once first, since one may be placeable
    only with another, then one by one, latest first; then regions that read what it reads (SwiGLU's
    backward: grad * silu(gate) beside silu's backward)."""
    producers = sorted((p for p in node.all_input_nodes if p in region_of), key=order.get, reverse=True)
    siblings = sorted({u for p in node.all_input_nodes for u in p.users if u in region_of and u is not node
                       and not _only_casts(region_of[u])} - set(producers),
                      key=order.get, reverse=True) if not _only_casts([node]) else []
    region, taken = [], set()
    together = {id(region_of[p]): region_of[p] for p in producers}
    if len(together) > 1:
        merged = sorted((n for r in together.values() for n in r), key=order.get)
        if _placeable(merged + group, order) and _plans(merged + group):
            region, taken = merged, set(merged)
    for other in producers + siblings:
        if other in taken:          # its region is merged in already (regions are disjoint)
            continue
        merged = sorted(region + region_of[other], key=order.get)
        if _placeable(merged + group, order) and _plans(merged + group):
            region, taken = merged, set(merged)
    return region + group


def _only_casts(region: list[fx.Node]) -> bool:
    """Views and casts alone: as a sibling, nothing to share but copies of one tensor (copy_shared_casts
    made them for their readers' kernels; the ones no kernel takes become one again)."""
    return all(n.target is torch.ops.aten._to_copy.default or not prep.computes(n) for n in region)


def _placeable(region: list[fx.Node], order: dict) -> bool:
    """One call can compute the region: every input it reads is ready before any outside reader of its
    results runs (the call goes at `_call_site`; views it reads move up to it, `_hoist_views`)."""
    inside = set(region)
    ready = [_ready(a, inside) for n in region for a in n.all_input_nodes if a not in inside]
    readers = [u for n in region for u in n.users if u not in inside]
    if None in ready:
        return False
    return not ready or not readers or max(map(order.__getitem__, ready)) < min(map(order.__getitem__, readers))


def _ready(node: fx.Node, inside: set) -> fx.Node | None:
    """The node after which `node` can run: itself, or for a view (AOT's detaches of saved tensors sit
    far below what they view) the tensor it views. None: it views a node of the region."""
    while prep.is_view(node):
        node = node.all_input_nodes[0]
        if node in inside:
            return None
    return node


def _hoist_views(inputs: list[fx.Node], site: fx.Node) -> None:
    """Views among the region's inputs that sit after the call site move up to just before it."""
    if not any(prep.is_view(n) for n in inputs):
        return                  # (anything else is computed before the site: _placeable)
    position = {n: i for i, n in enumerate(site.graph.nodes)}
    for node in inputs:
        chain = []
        while position[node] > position[site]:
            assert prep.is_view(node), f"{node.name} is read by a fused call placed before it"
            chain.append(node)
            node = node.all_input_nodes[0]
        for view in reversed(chain):
            site.prepend(view)


def _call_site(region: list[fx.Node]) -> fx.Node:
    """The node the fused call goes before: after the region's last node, unless an outside reader of
    its results lies between its nodes (a sibling region merged in): then before the first such reader."""
    inside = set(region)
    readers = {u for n in region for u in n.users if u not in inside}
    node = region[0]
    while node is not region[-1]:
        if node in readers:
            return node
        node = node.next
    return region[-1].next


def _subgraph(region: list[fx.Node]) -> tuple[fx.Graph, list[fx.Node], list[fx.Node]]:
    """(graph of the region, outside nodes it reads, region nodes read outside it) in graph order."""
    inside = set(region)
    graph, env, inputs = fx.Graph(), {}, []
    for n in region:
        for a in n.all_input_nodes:
            if a not in inside and a not in env:
                env[a] = graph.placeholder(f"in{len(inputs)}")
                inputs.append(a)
    for n in region:
        env[n] = graph.node_copy(n, env.__getitem__)
    outputs = [n for n in region if any(u not in inside for u in n.users)]
    graph.output(tuple(env[n] for n in outputs))
    return graph, inputs, outputs


def _plans(region: list[fx.Node]) -> bool:
    graph, inputs, outputs = _subgraph(region)
    if any(not isinstance(n.meta.get("val"), torch.Tensor) for n in outputs + inputs) or not outputs:
        return False            # (a size or scalar input: kernels take tensors only)
    described = [_described(a.meta["val"]) for a in inputs]
    # every layer of a model asks the same questions: the answer depends on the code and the inputs only
    key = (_canonical(graph), tuple(described))
    if key not in _PLANS:
        if len(_PLANS) > 100_000:
            _PLANS.clear()
        try:
            triton_kernels.check(graph, [triton_kernels.example(*d) for d in described])
            _PLANS[key] = True
        except NotFusible:
            _PLANS[key] = False
    return _PLANS[key]


class _Described(NamedTuple):
    """An example tensor's sizes, strides (symbolic ones at their hints), dtype and device: the device
    matters to ops whose constants name it (scalar_tensor, _to_copy)."""
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device


def _described(val: torch.Tensor) -> _Described:
    return _Described(tuple(compat.example_int(s) for s in val.shape),
                      tuple(compat.example_int(s) for s in val.stride()), val.dtype, val.device)


def _replace(gm: fx.GraphModule, region: list[fx.Node]) -> tuple[str, int]:
    graph, inputs, outputs = _subgraph(region)
    op, name = _custom_op(graph)
    site = _call_site(region)
    _hoist_views(inputs, site)
    with gm.graph.inserting_before(site):
        call = gm.graph.call_function(op, (list(inputs),))
    with gm.graph.inserting_after(call):
        for k, n in enumerate(outputs):
            item = gm.graph.call_function(operator.getitem, (call, k))
            item.meta["val"] = n.meta["val"]
            n.replace_all_uses_with(item, delete_user_cb=lambda u: u not in region)
    saved = sum(2 * _nbytes(n.meta.get("val")) for n in region if n not in outputs and prep.computes(n))
    for n in reversed(region):
        gm.graph.erase_node(n)
    return name, saved


def _nbytes(val) -> int:
    if not isinstance(val, torch.Tensor):
        return 0
    return compat.example_int(val.numel()) * val.element_size()


def _custom_op(graph: fx.Graph):
    """The custom op running this region's kernel; one per distinct region code in the process. Its
    call launches the kernel directly from Python (aten codegen, CUDA graphs, Triton's interpreter);
    `traceable` gives Inductor a body to trace instead, which launches it from Inductor's wrapper."""
    global _LIB
    module = fx.GraphModule(torch.nn.Module(), graph)
    name = "fused_" + hashlib.sha256(_canonical(graph).encode()).hexdigest()[:16]
    if name in _OPS:
        return _OPS[name], name
    if _LIB is None:
        _LIB = torch.library.Library("colauto", "FRAGMENT")
    _LIB.define(f"{name}(Tensor[] inputs) -> Tensor[]")
    kernel = triton_kernels.FusedRegion(graph)
    refused: set[tuple] = set()           # input signatures the generator refused

    def signature(inputs) -> tuple:
        return tuple((t.dtype, t.device, t.shape, t.stride()) for t in inputs)

    def attempt(inputs, launch):
        if not refused or signature(inputs) not in refused:     # the per-call path: no work when none are
            try:
                return list(launch(inputs))
            except NotFusible as exc:       # a signature the example shapes did not show
                refused.add(signature(inputs))
                FALLBACKS[str(exc)] += 1
                report.warn_once(f"colauto: a fused region runs as aten ops: {exc}")
        return _unaliased(_as_list(module(*inputs)), inputs)

    _LIB.impl(name, lambda inputs: attempt(inputs, lambda ts: kernel(*ts)), "CompositeExplicitAutograd")
    torch.library.register_fake(f"colauto::{name}", lib=_LIB)(
        lambda inputs: _unaliased(_as_list(module(*inputs)), inputs))
    _OPS[name] = op = getattr(torch.ops.colauto, name).default
    _TRACEABLE[op] = lambda inputs: attempt(inputs, lambda ts: kernel.run_wrapped(ts, torch.library.wrap_triton))
    return op, name


def traceable(target, inputs: list) -> Callable | None:
    """For a call of a colauto kernel op with these (fake) inputs, a body that Inductor can trace in its
    place: the kernel launched through torch's `wrap_triton` (Inductor's user-defined-kernel path: its
    generated wrapper launches it, no Python call per step), or the region's aten ops where the generator
    refuses the signature. None for any other target, under Triton's interpreter (Inductor launches
    Triton on GPUs only), and for symbolic sizes (the launch is planned for fixed ones)."""
    body = _TRACEABLE.get(target)
    if body is None or triton_kernels.interpreting():
        return None
    if any(isinstance(s, torch.SymInt) for t in inputs for s in (*t.shape, *t.stride())):
        return None
    return body


def _canonical(graph: fx.Graph) -> str:
    """The region's code with node names replaced by positions: the same ops in every layer share one op."""
    index = {n: f"%{i}" for i, n in enumerate(graph.nodes)}
    return ";".join(f"{n.op}:{n.target}:{fx.map_arg((n.args, n.kwargs), index.__getitem__)}" for n in graph.nodes)


def _unaliased(outputs: list, inputs: list) -> list:
    """The region's aten outputs with copies for any that share storage with an input or an earlier output:
    a custom op's outputs may alias neither (the kernel path copies the same way, triton_kernels.launch)."""
    seen = {t.untyped_storage()._cdata for t in inputs if isinstance(t, torch.Tensor)}
    for i, t in enumerate(outputs):
        if isinstance(t, torch.Tensor):
            key = t.untyped_storage()._cdata
            if key in seen:
                outputs[i] = t = t.clone()
                key = t.untyped_storage()._cdata
            seen.add(key)
    return outputs


def _as_list(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]
