"""Liveness simulation of a whole training step: which storages the allocator holds after each op.

The step runs as the partitioned graphs run: forward (boxed call: intermediates freed after their last
use), backward (saved tensors freed after their last use there), then the optimizer. What stays alive
throughout: parameters, optimizer state, the user's batch, and, from their creation in backward, the
gradients. Assumptions (stated in the README): steady state (step >= 2, so optimizer state exists),
gradients set to None before forward (`zero_grad(set_to_none=True)`), and
  adamw          fused AdamW: two moments of the parameter's dtype + one step scalar per parameter,
  adamw_foreach  the same plus one parameter-sized temporary (torch._foreach_sqrt of exp_avg_sq),
  sgd            no state (momentum off), none: no optimizer step.
Views share their base's storage; in-place ops write into their input. Constant sizes are rounded up
to the allocator's granularity; symbolic ones are not (they are large and already multiples of it).
"""
from __future__ import annotations

import dataclasses
import heapq
import math
import operator
import weakref
from typing import Callable, Sequence

import numpy as np
import sympy
import torch
import torch.fx as fx

from .device import DeviceSpec
from .flops import classify, is_aliasing
from .poly import Basis
from .shapes import Expr, storage_nbytes, sym, tensors_in


@dataclasses.dataclass
class Timeline:
    """Memory in use after each event of the step, as rows over `basis` (bytes)."""
    rows: np.ndarray
    labels: list[str]           # "fwd:node", "bwd:node", "optimizer"
    params: Expr
    grads: Expr
    optimizer_state: Expr
    saved: Expr                 # activations the forward keeps for backward (no parameter aliases)
    saved_nodes: list[tuple[str, Expr]]   # (forward node, bytes) of each saved storage, counted once
    inputs: Expr
    fused: frozenset[str] = frozenset()   # nodes costing no kernel of their own (Inductor codegen): kernel_fused_of
    # per graph ("fwd", "bwd"): memory in use as it starts, and the storages its inputs hold that die
    # when the graph drops them (each: its size, the inputs that share it); read by `compiled_peak`
    before: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    freeable: dict[str, list[tuple[np.ndarray, tuple[str, ...]]]] = dataclasses.field(default_factory=dict)
    # the same for a script that keeps only the loss (the model holds the user's outputs until after the
    # optimizer step): the storages that die too once their last input is freed, and those of outputs
    # no graph input holds, which die as the forward returns (`compiled_peak(outputs_dropped=True)`)
    freeable_if_dropped: dict[str, list[tuple[np.ndarray, tuple[str, ...]]]] = dataclasses.field(default_factory=dict)
    unread_outputs: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


# Inductor's lowering computes a pointwise result inside the loops of the kernels that read it (its value
# is "inlined") unless it realizes it into a buffer (torch._inductor.graph.GraphLowering.run_node,
# ir.StorageBox): where an extern kernel (matmul, collective, fallback) or the graph's return reads it; where
# several nodes read it and its inlined expression reads more than REALIZE_READS buffers or runs more than
# its op limit (config.realize_reads_threshold, realize_opcount_threshold); where the expression reads more
# than its accumulated-reads limit (realize_acc_reads_threshold); on CPU also where several nodes read an
# expression with a transcendental op. Limits per device: (ops, accumulated reads).
REALIZE_READS = 4
_REALIZE_LIMITS = {"cuda": (30, 8), "cpu": (50, 12)}
_CPU_HEAVY = frozenset(getattr(torch.ops.aten, n) for n in ("exp", "log", "log10", "log1p", "log2", "sigmoid", "tanh"))
# memory-bound ops Inductor lowers as pointwise loops (inlinable) beside those tagged pointwise; the rest of
# the memory-bound ops (reductions, softmax, norms, cat, scatter, sort, pooling, random) write a buffer
_aten = torch.ops.aten
_POINTWISE_LOWERED = frozenset({
    _aten.clone, _aten._to_copy, _aten.full, _aten.zeros, _aten.ones, _aten.full_like, _aten.zeros_like,
    _aten.ones_like, _aten.scalar_tensor, _aten.arange, _aten.embedding, _aten.index, _aten.gather,
    _aten.slice_scatter, _aten.select_scatter, _aten.select_backward, _aten.slice_backward,
    _aten.constant_pad_nd, _aten.tril, _aten.triu, _aten.expand_copy, _aten.view_copy, _aten.permute_copy,
    _aten.alias_copy, _aten.flip, _aten.roll, _aten.repeat})


_EXTERN = ("matmul", "comm", "unknown")     # kinds Inductor runs as extern kernels (they read buffers)


def _needed(nodes: list[fx.Node], members: set, kind: dict, returned: set) -> dict[fx.Node, bool]:
    """Whether each node's value must be a buffer: the graph returns it, or an extern kernel (matmul,
    collective, unknown op) reads it, directly or through views."""
    needed: dict[fx.Node, bool] = {}
    for n in reversed(nodes):
        users = [u for u in n.users if u in members]
        needed[n] = n in returned or any(
            kind[u] in _EXTERN or (kind[u] == "view" and needed[u]) for u in users)
    return needed


def extern_read(joint: fx.Graph) -> tuple[frozenset[str], frozenset[str]]:
    """(forward, backward): names of the joint graph's forward ops whose value, directly or through views,
    an extern kernel (matmul, collective, unknown op) reads in the forward (or the forward returns it),
    and in the backward. Such a value is a buffer there whatever the plan: a LayerNorm output a matmul
    reads is written by the forward anyway, and recomputed for a matmul in the backward it must be
    written again, by a kernel of its own (read its inputs, write it) that no consumer fuses."""
    fwd: set[fx.Node] = set()
    bwd: set[fx.Node] = set()
    for n in reversed(list(joint.nodes)):      # users first: a view's flags are known before its base's
        if n.op != "call_function":
            continue
        for u in n.users:
            if u.op == "output":
                fwd.add(n)      # the forward's outputs (the backward's are not forward values)
            elif u.op == "call_function":
                kind = _kind(u)
                if kind in _EXTERN:
                    (bwd if u.meta.get("partitioner_tag") == "is_backward" else fwd).add(n)
                elif kind == "view":
                    if u in fwd:
                        fwd.add(n)
                    if u in bwd:
                        bwd.add(n)
    forward = lambda s: frozenset(n.name for n in s if n.meta.get("partitioner_tag") != "is_backward")  # noqa: E731
    return forward(fwd), forward(bwd)


def kernel_fused_of(nodes: list[fx.Node], returned: set, recomputed: frozenset[str] = frozenset()) -> set[fx.Node]:
    """The time model's fused nodes: memory-bound nodes whose work runs inside another kernel, so that
    they cost no time of their own. Every consumer (through views) is memory-bound, at most
    REALIZE_READS of them, the node is not returned, and a recomputed node has one reader (a recomputed
    group's kernel writes what several read). Coarser than `fused_away_of` (which says what is written,
    for memory): a realized pointwise or reduction that Inductor's scheduler fuses into its producer's
    or consumer's kernel still costs nothing here, as the step times measured on H100/H200s showed."""
    members = set(nodes)
    kind = {n: _kind(n) for n in nodes}
    needed = _needed(nodes, members, kind, returned)
    readers = {n: sum(1 for u in n.users if u in members) for n in nodes}
    return {n for n in nodes if kind[n] == "memory" and not needed[n] and readers[n] <= REALIZE_READS
            and not isinstance(n.meta.get("val"), (tuple, list))
            and (n.name not in recomputed or readers[n] == 1)}


def _inlinable(n: fx.Node, cpu: bool = False, members: set | None = None) -> bool:
    """Whether Inductor lowers the node as pointwise loops. A cat of at most 8 inputs whose readers are
    all pointwise is a pointwise cat on GPUs (lowering.cat); on CPU a ConcatKernel writes it."""
    op = n.target
    if not isinstance(op, torch._ops.OpOverload) or isinstance(n.meta.get("val"), (tuple, list)):
        return False
    if op.overloadpacket is _aten.cat:
        return (not cpu and members is not None and len(n.args[0]) <= 8
                and all(_kind(u) == "memory" and _inlinable(u) for u in n.users if u in members))
    return torch.Tag.pointwise in op.tags or op.overloadpacket in _POINTWISE_LOWERED


def fused_away(graph: fx.Graph, cpu: bool = False) -> set[fx.Node]:
    """Memory-bound nodes that Inductor computes inside their consumers' kernels, never writing them to
    memory (the rule above the limits). Matmul-class, collective and unknown ops read materialized buffers."""
    nodes = [n for n in graph.nodes if n.op == "call_function"]
    return fused_away_of(nodes, set(list(graph.nodes)[-1].all_input_nodes), cpu=cpu)


def fused_away_of(nodes: list[fx.Node], returned: set, cpu: bool = False) -> set[fx.Node]:
    """`fused_away` for the graph that runs `nodes` (in an order Inductor could lower them in) and returns
    `returned` (a modeled partition's forward or backward, as nodes of the joint graph): only users among
    `nodes` are its readers. Each inlined node carries what its expression reads (the buffers, through
    inlined inputs and views) and its op count, as Inductor's loops body does."""
    members = set(nodes)
    ops_limit, acc_limit = _REALIZE_LIMITS["cpu" if cpu else "cuda"]
    kind = {n: _kind(n) for n in nodes}
    needed = _needed(nodes, members, kind, returned)
    base: dict[fx.Node, fx.Node] = {}                          # a view -> the node whose value it shows
    inlined: dict[fx.Node, tuple[frozenset, frozenset, bool]] = {}  # node -> (buffers read, ops in it, heavy op)

    def loads(a: fx.Node) -> tuple[frozenset, frozenset, bool]:
        a = base.get(a, a)
        return inlined.get(a, (frozenset([a]), frozenset(), False))
    addmms = addmm_fused(nodes, cpu)
    sums = set(addmms.values())   # each an addmm Inductor runs: written, not inlined
    for n in nodes:
        if kind[n] == "view":
            src = next(iter(n.all_input_nodes), None)
            if src is not None:
                base[n] = base.get(src, src)
            continue
        if kind[n] != "memory" or needed[n] or n in sums or not _inlinable(n, cpu, members):
            continue
        reads, body, heavy = frozenset(), frozenset([n]), cpu and n.target.overloadpacket in _CPU_HEAVY
        for a in n.all_input_nodes:
            r, b, h = loads(a)
            reads, body, heavy = reads | r, body | b, heavy or h
        ops = len(body) + len(reads)        # each op and load once: Inductor counts after CSE
        fanout = sum(1 for u in n.users if u in members)
        if fanout > 1 and (ops > ops_limit or len(reads) > REALIZE_READS or heavy):
            continue
        if len(reads) > acc_limit or ops > ops_limit:
            continue
        inlined[n] = (reads, body, heavy)
    return set(inlined) | set(addmms)


def addmm_fused(nodes: list[fx.Node], cpu: bool = False) -> dict[fx.Node, fx.Node]:
    """mm -> the add Inductor's post-grad pass makes one addmm of (`post_grad.addmm`, torch 2.11-2.13):
    `add(mm(a, b), c)` where the product has no other reader, c is a tensor that broadcasts to it, of the
    same dtype as a and b, and (on GPUs, `should_prefer_unfused_addmm`) not every reader of the sum is
    pointwise. The product then runs where the sum is: a and b are read until there, and the product is
    never a buffer of its own. Seen on tied embeddings in fp32 (HF MPT, Cohere, Gemma, T5, BART on CPU):
    the head's weight gradient, added to the embedding's at the end of the backward, kept the [tokens,
    vocabulary] logits gradient alive through the whole backward; the model freed it after the head and
    was low (no budget, CPU allocator: MPT -5.8%, now 0.0%; Cohere -10.2%, now -3.6%)."""
    members = set(nodes)
    fused: dict[fx.Node, fx.Node] = {}
    for n in nodes:
        if n.target is not _aten.mm.default or len(n.users) != 1:
            continue
        (u,) = n.users
        if u not in members or u.target is not _aten.add.Tensor or u.kwargs or len(u.args) != 2:
            continue
        inp = u.args[1] if u.args[0] is n else u.args[0]
        if inp is n or not isinstance(inp, fx.Node):
            continue
        c, a, b, out = (x.meta.get("val") for x in (inp, *n.args[:2], n))
        if not all(isinstance(t, torch.Tensor) for t in (c, a, b, out)):
            continue
        if c.dtype != a.dtype or c.dtype != b.dtype or not _broadcasts_to(c.shape, out.shape):
            continue
        if not cpu and all(_pointwise_use(r) for r in u.users):
            continue
        fused[n] = u
    return fused


def _broadcasts_to(shape, target) -> bool:
    return len(shape) <= len(target) and all(s == 1 or s == t for s, t in zip(reversed(shape), reversed(target)))


def _pointwise_use(use: fx.Node) -> bool:
    """Inductor's `is_pointwise_use`: a reader that is pointwise, or a view all of whose readers are."""
    if use.op != "call_function":
        return False
    if use.target is operator.getitem or (isinstance(use.target, torch._ops.OpOverload) and _kind(use) == "view"):
        return all(_pointwise_use(u) for u in use.users)
    return isinstance(use.target, torch._ops.OpOverload) and torch.Tag.pointwise in use.target.tags


def inductor_order(graph: fx.Graph, recomputed: frozenset[str]) -> list[fx.Node]:
    """The graph's nodes in the order Inductor runs them, as far as memory goes: recomputed memory-bound
    ops that feed one another form one fused kernel, which runs (and allocates all its outputs) right
    before the first op outside the group that reads one of them. Seen on GPT-2: the whole recomputed
    residual stream of 12 layers ran as one kernel at the start of backward; on HF Qwen2-0.5B under a
    budget (one H200), after the loss's backward kernel had freed the logits, before the final norm's
    backward. Placed at the group's first op instead, the model held the recomputed residual stream
    (96 fp32 tensors, 2.7 GB) beside the logits: a peak predicted 5% high. Otherwise the graph's order."""
    return inductor_order_of(list(graph.nodes), recomputed)


def needed_at(graph: fx.Graph, recomputed: frozenset[str]) -> dict[str, int]:
    """Each op's position in the graph; a recomputed op's is that of the first op outside the
    recomputation that reads it, directly or through other recomputed ops (where `inductor_order` runs
    it: just before that reader)."""
    nodes = list(graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    at: dict[fx.Node, int] = {}
    for n in reversed(nodes):   # users first: each user's position is known when its inputs are visited
        recomputes = n.name in recomputed and n.op == "call_function"
        at[n] = min((at[u] for u in n.users), default=len(nodes)) if recomputes else pos[n]
    return {n.name: i for n, i in at.items() if n.op == "call_function"}


def inductor_order_of(nodes: list[fx.Node], recomputed: frozenset[str]) -> list[fx.Node]:
    """`inductor_order` of the graph that runs `nodes` (in this order; inputs from outside them are
    ready from the start)."""
    pos = {n: i for i, n in enumerate(nodes)}
    group = {n: n for n in nodes}

    def root(n):
        while group[n] is not n:
            group[n] = group[group[n]]
            n = group[n]
        return n

    def fusible(n) -> bool:
        return n.op == "call_function" and n.name in recomputed and _kind(n) in ("memory", "view")

    for n in nodes:
        if fusible(n):
            for a in n.all_input_nodes:
                if a in pos and fusible(a):
                    ra, rn = root(a), root(n)
                    if ra is not rn:
                        group[max(ra, rn, key=pos.get)] = min(ra, rn, key=pos.get)
    # a group runs just before its first outside reader (a group no one outside reads: at its first op)
    first_reader: dict[fx.Node, float] = {}
    for n in nodes:
        if fusible(n):
            r = root(n)
            outside = [pos[u] for u in n.users if u in pos and not (fusible(u) and root(u) is r)]
            first_reader[r] = min([first_reader.get(r, float(len(nodes)))] + outside)
    start = {n: first_reader[root(n)] - 0.5 if fusible(n) else pos[n] for n in nodes}
    waiting = {n: len({a for a in n.all_input_nodes if a in pos}) for n in nodes}
    ready = [(start[n], pos[n], n) for n in nodes if waiting[n] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, _, n = heapq.heappop(ready)
        order.append(n)
        for u in n.users:
            if u in pos:
                waiting[u] -= 1
                if waiting[u] == 0:
                    heapq.heappush(ready, (start[u], pos[u], u))
    return order


class _Sim:
    def __init__(self, basis: Basis, device: DeviceSpec, fused: bool = False) -> None:
        self.basis, self.device, self.fused = basis, device, fused
        self.virtual: set[fx.Node] = set()
        self.fused_names: set[str] = set()
        self.size: list[tuple] = []           # storage id -> sparse size
        self.refs: list[int] = []             # storage id -> live references
        self.state = np.zeros(0)
        self._released: dict[fx.Node, list[fx.Node]] = {}   # run_nodes: node -> the values that die in it
        self.rows: list[np.ndarray] = []
        self.labels: list[str] = []
        self.before: dict[str, np.ndarray] = {}
        self.freeable: dict[str, list[tuple[np.ndarray, tuple[str, ...]]]] = {}
        self.tangents: set[int] = set()    # the backward's tangent storages (_run_step)
        self.user_outputs: set[int] = set()   # the storages of the forward's outputs the user gets (_run_step)
        self.freeable_if_dropped: dict[str, list[tuple[np.ndarray, tuple[str, ...]]]] = {}
        self.unread_outputs: dict[str, np.ndarray] = {}

    def _vec(self, sparse) -> np.ndarray:
        v = np.zeros(len(self.basis.terms))
        for j, c in sparse:
            v[j] += c
        return v

    def _grow(self) -> None:
        if len(self.state) < len(self.basis.terms):
            self.state = np.pad(self.state, (0, len(self.basis.terms) - len(self.state)))

    def _rounded(self, nbytes: Expr) -> Expr:
        if not nbytes.free_symbols and self.device.alloc_round > 1:
            r = self.device.alloc_round
            return sym(-(-int(nbytes) // r) * r)
        return nbytes

    def _measure(self, nbytes: Expr):
        """A storage's size as this simulation keeps it (sparse over the basis)."""
        return self.basis.sparse(self._rounded(nbytes))

    def new(self, nbytes: Expr) -> int:
        """A fresh storage with one reference (its creator's); permanent holders never drop it."""
        self.size.append(self._measure(nbytes))
        self.refs.append(1)
        self._grow()
        self.state += self._vec(self.size[-1])
        return len(self.size) - 1

    def ref(self, sid: int, n: int = 1) -> None:
        self.refs[sid] += n

    def unref(self, sid: int) -> None:
        self.refs[sid] -= 1
        if self.refs[sid] == 0:
            self._grow()
            self.state -= self._vec(self.size[sid])

    def record(self, label: str) -> None:
        self._grow()
        self.rows.append(self.state.copy())
        self.labels.append(label)

    def run(self, graph: fx.Graph, tag: str, env: dict[str, list[int]], placeholders_held: bool,
            recomputed: frozenset[str] = frozenset()) -> list[list[int]]:
        """Simulate one graph. env: placeholder name -> storages (given by the caller, already referenced
        once per placeholder). Returns the storages of each graph output, each referenced once more."""
        nodes = inductor_order(graph, recomputed) if self.fused else list(graph.nodes)
        calls = [n for n in nodes if n.op == "call_function"]
        returned = set(list(graph.nodes)[-1].all_input_nodes)
        self.virtual = fused_away_of(calls, returned, cpu=self.device.name == "cpu") if self.fused else set()
        if self.fused:
            self.fused_names.update(n.name for n in kernel_fused_of(calls, returned, recomputed))
        self._graph_starts(tag, nodes, env, placeholders_held)
        return self.run_nodes([n for n in nodes if n.op not in ("placeholder", "output")],
                              [n for n in nodes if n.op == "placeholder"], list(nodes[-1].args[0]),
                              tag, env, placeholders_held)

    def _graph_starts(self, tag: str, nodes: list[fx.Node], env: dict[str, list[int]], placeholders_held: bool) -> None:
        """Note what `compiled_peak` needs of a graph about to run: the memory in use, and which of its
        inputs' storages die when it drops them."""
        self._grow()
        self.before[tag] = self.state.copy()
        if not placeholders_held:
            # the storages only this graph's inputs hold die when it drops them; a tangent too, though the
            # model holds it until the backward returns: AOTAutograd hands its compiled backward the only
            # reference (HF BERT's 2 MiB logits gradient died at the wrapper's `del`, CPU allocator)
            names: dict[int, list[str]] = {}
            for n in nodes:
                if n.op == "placeholder":
                    for sid in env.get(n.name, []):
                        names.setdefault(sid, []).append(n.name)
            held = {sid: self.refs[sid] - len(ns) - (sid in self.tangents) for sid, ns in names.items()}
            self.freeable[tag] = [(self._vec(self.size[sid]), tuple(ns)) for sid, ns in names.items() if held[sid] == 0]
            self.freeable_if_dropped[tag] = [(self._vec(self.size[sid]), tuple(ns)) for sid, ns in names.items()
                                             if held[sid] == 1 and sid in self.user_outputs]
            unread = [self._vec(self.size[sid]) for sid in self.user_outputs if sid not in names and self.refs[sid] == 1]
            self.unread_outputs[tag] = sum(unread, np.zeros(len(self.basis.terms)))

    def run_nodes(self, nodes: list[fx.Node], inputs: list[fx.Node], outputs: list, tag: str,
                  env: dict[str, list[int]], inputs_held: bool) -> list[list[int]]:
        """Run `nodes` in this order. `inputs` (a graph's placeholders, or the joint graph's nodes a
        modeled partition passes between forward and backward) take their storages from env by name;
        `outputs` are returned, each storage referenced once more."""
        end = object()                       # the graph's return: the last use of what it returns
        last_use: dict[fx.Node, object] = {}
        pos = {n: i for i, n in enumerate(nodes)}
        reads_end = self._reads_end(nodes, pos)
        for n in nodes:
            e = reads_end[n]
            for a in n.all_input_nodes:
                if a not in last_use or pos[e] > pos[last_use[a]]:
                    last_use[a] = e
        for a in outputs:
            if isinstance(a, fx.Node):
                last_use[a] = end
        stor: dict[fx.Node, list[int]] = {}
        for n in inputs:
            stor[n] = env.get(n.name, [])
            if not inputs_held and n not in last_use:
                self._release(stor[n])
        held = set(inputs) if inputs_held else set()
        released: dict[fx.Node, list[fx.Node]] = {}
        for a, n in last_use.items():
            if n is not end:
                released.setdefault(n, []).append(a)
        self._released = released
        for n in nodes:
            stor[n] = self._outputs(n, stor, held)
            scratch = op_workspace(n)     # the op's own buffers, beside its outputs until it returns
            scratch = [self.new(sym(scratch))] if scratch else []
            self.record_node(tag, n)
            self._release(scratch)
            if n not in last_use:            # computed but unused: freed at once
                self._release(stor[n])
            for a in released.get(n, ()):
                if a not in held:
                    self._release(stor[a])
        results = []
        for a in outputs:
            sids = stor.get(a, []) if isinstance(a, fx.Node) else []
            for s in sids:
                self.ref(s)
            results.append(sids)
        # the graph's own references end when it returns
        for a in set(x for x in outputs if isinstance(x, fx.Node)):
            if last_use.get(a) is end and a not in held:
                self._release(stor[a])
        return results

    def _reads_end(self, nodes: list[fx.Node], pos: dict[fx.Node, int]) -> dict[fx.Node, fx.Node]:
        """Where each node's reads of its inputs end: at the node itself, except for a value fused into
        its readers (`virtual`) and a view of one, which Inductor computes inside every reader's loop, so
        what it reads is read until the last of those kernels runs (HF T5's attention-probability gradient
        was freed at the inlined product that reads it, before the kernel that runs that product
        allocated its output: 8 MB under at the peak, CPU)."""
        ends = {n: n for n in nodes}
        if not self.virtual:
            return ends
        inlined = set()
        for n in nodes:
            if n in self.virtual or (_node_storage(n)[0] and n.all_input_nodes and n.all_input_nodes[0] in inlined):
                inlined.add(n)
        for n in reversed(nodes):
            if n in inlined:
                later = [ends[u] for u in n.users if u in pos]
                ends[n] = max(later, key=pos.__getitem__, default=n)
        return ends

    def record_node(self, tag: str, n: fx.Node) -> None:
        self.record(f"{tag}:{n.name}")

    def _release(self, sids: list[int]) -> None:
        for s in sids:
            self.unref(s)

    def _outputs(self, n: fx.Node, stor: dict[fx.Node, list[int]], held: set) -> list[int]:
        if n.target is operator.getitem:
            parent, idx = n.args[0], n.args[1]
            sids = stor[parent]
            # views of one input (split, unbind, chunk): every one holds that input's storage
            views = parent.op == "call_function" and _node_storage(parent)[0]
            sid = (sids[0] if sids else None) if views else _nth_tensor_storage(parent, idx, sids)
            if sid is None:
                return []
            self.ref(sid)
            return [sid]
        aliases, nbytes = _node_storage(n)
        if aliases:  # views and in-place ops: the output is the first tensor input's storage
            src = next((a for a in n.all_input_nodes if stor.get(a)), None)
            sids = list(stor[src][:1]) if src is not None else []
            for s in sids:
                self.ref(s)
            return sids
        if n in self.virtual:   # fused into its consumers: a zero-byte placeholder keeps refcounts uniform
            return [self.new(sym(0)) for _ in nbytes]
        if self.fused and len(nbytes) == 1 and _inlinable(n):   # a pointwise kernel Inductor writes
            return self._in_place(n, nbytes[0], stor, held)
        return [self.new(b) for b in nbytes]

    def _in_place(self, n: fx.Node, nbytes: Expr, stor: dict[fx.Node, list[int]], held: set) -> list[int]:
        """The buffer (of `nbytes`) of a pointwise kernel Inductor writes: that of a value it reads (itself
        or through values fused into it) which dies in this kernel, is no one else's (a view of it, a graph
        input the caller holds) and has its size (the scheduler's in-place reuse, `in_out_ptr`); not one
        that a reduction this kernel reads also reads, since Inductor fuses the two and reads it at two
        indices (`single_index_in_fused_node`: HF T5's softmax backward); else a new one."""
        size = self._measure(nbytes)
        dying = [a for a in self._released.get(n, ()) if a not in held]
        blocked = self._read_by_fused_reductions(n) if dying else set()
        for a in dying:
            sids = stor.get(a, [])
            if (len(sids) == 1 and self.refs[sids[0]] == 1 and self.size[sids[0]] == size
                    and a not in blocked):
                self.ref(sids[0])
                return [sids[0]]
        return [self.new(nbytes)]

    def _read_by_fused_reductions(self, n: fx.Node) -> set[fx.Node]:
        """What the reductions (memory-bound ops Inductor does not inline) `n` reads read, through the
        values fused into them and views of those."""
        cpu, found = self.device.name == "cpu", set()
        for r in n.all_input_nodes:
            if r in self.virtual or r.op != "call_function" or _kind(r) != "memory" or _inlinable(r, cpu):
                continue
            todo = list(r.all_input_nodes)
            while todo:
                x = todo.pop()
                if x in found:
                    continue
                found.add(x)
                if x in self.virtual or (x.op == "call_function" and _node_storage(x)[0]):
                    todo.extend(x.all_input_nodes)
        return found


_STORAGE: "weakref.WeakKeyDictionary[fx.Node, tuple[bool, list[Expr]]]" = weakref.WeakKeyDictionary()
_KINDS: "weakref.WeakKeyDictionary[fx.Node, str]" = weakref.WeakKeyDictionary()


def _kind(n: fx.Node) -> str:
    """flops.classify of a call node, once per node (predict_partition asks for the same joint graph's
    nodes once per candidate plan); a cache, not a way to observe results."""
    got = _KINDS.get(n)
    if got is None:
        got = _KINDS[n] = classify(n.target, bool(tensors_in(n.meta.get("val"))))
    return got


def _node_storage(n: fx.Node) -> tuple[bool, list[Expr]]:
    """(whether the node's output aliases an input: a view or an in-place op; the bytes of each storage it
    creates otherwise). Fixed for a node, so computed once per node (predict_partition simulates the same
    joint graph's nodes once per candidate plan); a cache, not a way to observe results."""
    got = _STORAGE.get(n)
    if got is None:
        op = n.target
        aliases = isinstance(op, torch._ops.OpOverload) and (is_aliasing(op) or any(
            r.alias_info is not None for r in op._schema.returns))
        got = _STORAGE[n] = (aliases, [storage_nbytes(t) for t in tensors_in(n.meta.get("val"))])
    return got


def _flash_cpu_splits(q_len: int, kv_len: int) -> tuple[int, int]:
    """The query and key blocks ATen's CPU flash attention works in (FlashAttentionKernel.cpp, torch 2.11-2.13)."""
    q_split = 256 if q_len >= 768 else 64 if q_len >= 192 else 32
    return min(q_split, q_len), min(512, kv_len)


def op_workspace(n: fx.Node) -> int:
    """Bytes an op allocates for itself and frees before it returns, beside its outputs; 0 where none is
    known. ATen's CPU flash attention, fp32 (FlashAttentionKernel.cpp; each term measured exactly on the CPU
    allocator over shapes, layouts, 1 and 2 threads, with and without a mask: tests/test_memory.py). The
    forward holds per thread a query block's scores against a key block, its running max and sum, and its
    output block. The backward holds per thread the block's scores and their gradient, and a copy of the
    output's gradient where that is not laid out (batch, query, head, dim). Other dtypes, and GPU attention
    kernels' workspaces, are not modelled (the README's limits)."""
    if n.target not in _FLASH_CPU:
        return 0
    backward = n.target is _FLASH_CPU[1]
    q, k = (n.args[1], n.args[2]) if backward else (n.args[0], n.args[1])
    qv, kv = q.meta.get("val"), k.meta.get("val")
    if not (isinstance(qv, torch.Tensor) and isinstance(kv, torch.Tensor)) or qv.dtype != torch.float32:
        return 0
    from .._torch_compat import example_int
    q_len, head = example_int(qv.shape[-2]), example_int(qv.shape[-1])
    q_split, kv_split = _flash_cpu_splits(q_len, example_int(kv.shape[-2]))
    threads = torch.get_num_threads()
    if not backward:
        return 4 * threads * (q_split * kv_split + 2 * q_split + q_split * head)
    grad = n.args[0].meta.get("val")
    copied = 0
    if isinstance(grad, torch.Tensor) and grad.dim() == 4:
        shape = [example_int(d) for d in grad.shape]
        strides = [example_int(d) for d in grad.stride()]
        order = (0, 2, 1, 3)    # (batch, query, head, dim): the layout the kernel reads
        if not _dense([shape[i] for i in order], [strides[i] for i in order]):
            copied = math.prod(shape) * grad.element_size()
    return 4 * (threads * 2 * q_split * kv_split + q_split) + copied


def _dense(shape: list[int], strides: list[int]) -> bool:
    """Whether a tensor of `shape` and `strides` is contiguous (dims of size 1 ignored)."""
    expected = 1
    for size, stride in reversed(list(zip(shape, strides))):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


_FLASH_CPU = tuple(getattr(torch.ops.aten, name).default for name in (
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward"))


def _nth_tensor_storage(parent: fx.Node, idx: int, sids: list[int]) -> int | None:
    vals = parent.meta.get("val")
    if not isinstance(vals, (tuple, list)) or not isinstance(vals[idx], torch.Tensor):
        return None
    pos = sum(1 for v in vals[:idx] if isinstance(v, torch.Tensor))
    return sids[pos] if pos < len(sids) else None


def _placeholder_bytes(n: fx.Node) -> Expr:
    val = n.meta.get("val")
    return storage_nbytes(val) if isinstance(val, torch.Tensor) else sym(0)


@dataclasses.dataclass
class _Split:
    """A partition of the joint graph as the simulation runs it: partitioned graphs, or the partition
    `predict_partition` models. Each run function takes (simulator, env: input name -> storages)."""
    fw_inputs: list[fx.Node]                  # forward placeholders (primals, then the batch)
    fw_outputs: list                          # the user's outputs, then the values saved for backward
    run_fw: Callable[["_Sim", dict], list]
    bw_inputs: list[fx.Node] | None = None    # saved values (by name) and tangents; None: no backward
    bw_outputs: list = dataclasses.field(default_factory=list)   # gradients, in the primals' order
    run_bw: Callable[["_Sim", dict], list] | None = None


def _graph_split(fw: fx.GraphModule, bw: fx.GraphModule | None) -> _Split:
    fw_nodes = list(fw.graph.nodes)
    if bw is None:
        return _Split([n for n in fw_nodes if n.op == "placeholder"], list(fw_nodes[-1].args[0]),
                      lambda sim, env: sim.run(fw.graph, "fwd", env, placeholders_held=True))
    bw_nodes = list(bw.graph.nodes)
    # forward nodes the backward graph runs again
    recomputed = frozenset(n.name for n in fw_nodes) & frozenset(n.name for n in bw_nodes if n.op == "call_function")
    return _Split([n for n in fw_nodes if n.op == "placeholder"], list(fw_nodes[-1].args[0]),
                  lambda sim, env: sim.run(fw.graph, "fwd", env, placeholders_held=True),
                  [n for n in bw_nodes if n.op == "placeholder"], list(bw_nodes[-1].args[0]),
                  lambda sim, env: sim.run(bw.graph, "bwd", env, placeholders_held=False, recomputed=recomputed))


def optimizer_states(optimizer: str) -> int:
    """Parameter-sized state tensors the optimizer keeps per trained parameter (AdamW's two moments)."""
    return 2 if optimizer in ("adamw", "adamw_foreach") else 0


def simulate_step(fw: fx.GraphModule, bw: fx.GraphModule | None, *, param_indices: Sequence[int],
                  num_fwd_outputs: int, basis: Basis, device: DeviceSpec, optimizer: str,
                  fused: bool = False) -> Timeline:
    """Memory in use through forward, backward and the optimizer step (see module docstring).
    `fused`: the graphs run as Inductor code, so `fused_away` intermediates take no memory."""
    sim = _Sim(basis, device, fused)
    total, saved = _run_step(sim, _graph_split(fw, bw), param_indices=param_indices,
                             num_fwd_outputs=num_fwd_outputs, device=device, optimizer=optimizer)
    saved_nodes = [(name, _size_expr(basis, sim.size[sid])) for name, sid in saved]
    rows = np.zeros((len(sim.rows), len(basis.terms)))
    for i, r in enumerate(sim.rows):     # rows recorded before later basis terms existed are shorter
        rows[i, :len(r)] = r
    k = len(basis.terms)
    padded = lambda v: np.pad(v, (0, k - len(v)))  # noqa: E731
    return Timeline(rows=rows, labels=sim.labels, params=total["params"], grads=total["grads"],
                    optimizer_state=total["opt"], saved=sympy.Add(*[e for _, e in saved_nodes]),
                    inputs=total["inputs"], saved_nodes=saved_nodes, fused=frozenset(sim.fused_names),
                    before={t: padded(v) for t, v in sim.before.items()},
                    freeable={t: [(padded(v), ns) for v, ns in g] for t, g in sim.freeable.items()},
                    freeable_if_dropped={t: [(padded(v), ns) for v, ns in g] for t, g in sim.freeable_if_dropped.items()},
                    unread_outputs={t: padded(v) for t, v in sim.unread_outputs.items()})


# An event of a graph's wrapper (`compat.wrapper_allocations`) whose "freed" field starts with this names an
# input the graph returned as a copy of its own: the copy's bytes stay in use into the graph that reads it.
RETURNED_COPY = "returned as a copy: "


def compiled_peak(tl: Timeline, allocations: dict[str, list[tuple[int, str, str]]], values: np.ndarray,
                  alloc_round: int = 1, outputs_dropped: bool = False) -> tuple[int, str]:
    """The step's peak (bytes, where) with the graphs Inductor compiled run as their generated code
    does (`allocations`: per graph tag, what its wrapper allocates and frees, `compat.wrapper_allocations`)
    instead of as the model runs their nodes: each such graph starts from the memory the model has in
    use at its start, and an input's storage dies when every input that holds it is freed. The rest of
    the step (before the forward, the optimizer step) is the model's. `outputs_dropped`: for a script
    that keeps only the loss (`loss = model(**batch).loss`), not the model's outputs until after the
    optimizer step as the model assumes: an output no backward input holds dies as the forward returns,
    and one the backward reads dies where the backward frees it."""
    return compiled_live_at_peak(tl, allocations, values, alloc_round, outputs_dropped)[:2]


def compiled_live_at_peak(tl: Timeline, allocations: dict[str, list[tuple[int, str, str]]], values: np.ndarray,
                          alloc_round: int = 1, outputs_dropped: bool = False) -> tuple[int, str, list[tuple[str, int]]]:
    """`compiled_peak`, and what is live there: (name, bytes) of the compiled graph's own buffers, of
    its inputs' storages not yet freed, and the rest of what the model has in use at its start."""
    mem = tl.rows @ values
    tags = tuple(f"{t}:" for t in allocations)
    rest = [(int(round(m)), label) for m, label in zip(mem, tl.labels) if not label.startswith(tags)]
    if outputs_dropped and "bwd" in tl.unread_outputs:   # after the backward the outputs are gone too
        gone = float(tl.unread_outputs["bwd"] @ values) + sum(float(v @ values) for v, _ in tl.freeable_if_dropped["bwd"])
        rest = [(m - int(round(gone)) if label == "optimizer" else m, label) for m, label in rest]
    best = (*max(rest, default=(0, "")), [])
    for tag, events in allocations.items():
        start = float(tl.before[tag] @ values)
        freeable = tl.freeable.get(tag, [])
        if outputs_dropped and tag in tl.unread_outputs:
            start -= float(tl.unread_outputs[tag] @ values)
            freeable = freeable + tl.freeable_if_dropped[tag]
        groups = [(float(v @ values), ns) for v, ns in freeable]
        if tag == "bwd":
            copies = _copies_taken(allocations.get("fwd", []), events, alloc_round)
            start += sum(nb for nb, _ in copies)
            groups += copies
        peak, at = _replay(events, start, groups, alloc_round)
        if peak > best[0] and at is not None:   # replayed again to the peak, for what is live there
            buffers, held = _replay(events[:at + 1], start, groups, alloc_round, live=True)
            listed = sorted([(n, int(b)) for n, b in buffers.items()]
                            + [("input " + ",".join(ns), int(size)) for size, ns in held], key=lambda x: -x[1])
            listed.append((f"the rest in use as {tag} starts", int(start - sum(size for size, _ in groups))))
            best = (int(round(peak)), f"{tag}:{events[at][2].split(' ')[0]} (compiled)", listed)
    return best


def _copies_taken(fwd: list[tuple[int, str, str]], bwd: list[tuple[int, str, str]],
                  alloc_round: int) -> list[tuple[float, tuple[str]]]:
    """(bytes, (input name,)) of each input the forward returned as a copy of its own
    (`compat.returned_copies`) that the backward frees. The model has them as the inputs' storages, held
    elsewhere; the copies are extra until the backward drops them. A copy the backward never takes (one
    returned to the user) is not the backward's to hold."""
    taken = {freed for _, freed, _ in bwd if freed}
    found = [(float(_round_up(nb, alloc_round)), freed[len(RETURNED_COPY):]) for nb, freed, _ in fwd
             if freed.startswith(RETURNED_COPY)]
    return [(nb, (name,)) for nb, name in found if name in taken]


def _round_up(nbytes: float, alloc_round: int) -> float:
    """An allocation's bytes as the allocator takes them (a free: the same, negative)."""
    return math.copysign(-(-abs(nbytes) // alloc_round) * alloc_round, nbytes) if alloc_round > 1 else nbytes


def _replay(events: list[tuple[int, str, str]], start: float, groups: list[tuple[float, tuple[str, ...]]],
            alloc_round: int, live: bool = False):
    """One compiled graph's events from `start` bytes in use; `groups`: (bytes, the inputs holding them)
    of the input storages that die once all of those inputs are freed. (peak, index of the event that
    reached it, None if none rose above `start`); with `live`, instead (buffer -> bytes live after the
    last event, the groups not yet freed)."""
    left = [set(ns) for _, ns in groups]
    group_of: dict[str, list[int]] = {}
    for i, (_, ns) in enumerate(groups):
        for n in ns:
            group_of.setdefault(n, []).append(i)
    mem = peak = start
    at = None
    buffers: dict[str, float] = {}
    for k, (nbytes, freed, name) in enumerate(events):
        if freed:
            for i in group_of.get(freed, ()):
                left[i].discard(freed)
                if not left[i]:
                    mem -= groups[i][0]
            continue
        nbytes = _round_up(nbytes, alloc_round)
        mem += nbytes
        if live:
            if nbytes > 0:
                buffers[name] = nbytes
            else:
                buffers.pop(name, None)
        if mem > peak:
            peak, at = mem, k
    if live:
        return buffers, [(size, ns) for (size, ns), rest in zip(groups, left) if rest]
    return peak, at


TRAINS = "colauto_trains"   # a primal placeholder's meta: whether it is a parameter that trains (mark_trained)
UNUSED_GRAD = "colauto_unused_grad"   # a tangent placeholder's meta: autograd passes None for it (output_grads.py)


def mark_trained(joint: fx.Graph, param_indices: Sequence[int], trained: Sequence[int]) -> None:
    """Record on the joint graph's parameter primals which of them train, where the backward's gradient
    outputs do not line up with the primals (a graph of DTensor inputs: compat.joint_param_positions).
    The forward graph's placeholders carry the mark (the partitioner copies their meta)."""
    primals = [n for n in joint.nodes if n.op == "placeholder" and not n.name.startswith("tangents")]
    trains = set(trained)
    for i in param_indices:
        primals[i].meta[TRAINS] = i in trains


def trained(fw_ph: list[fx.Node], params: set[int], grads: list) -> list[int]:
    """The parameters (primal positions) that train: as marked (mark_trained), else those whose
    gradient output, at the same position, exists."""
    if any(TRAINS in fw_ph[i].meta for i in params if i < len(fw_ph)):
        return [i for i in sorted(params) if fw_ph[i].meta.get(TRAINS)]
    return [i for i in sorted(params) if i < len(grads) and grads[i] is not None]


def _run_step(sim: "_Sim", split: _Split, *, param_indices: Sequence[int], num_fwd_outputs: int,
              device: DeviceSpec, optimizer: str) -> tuple[dict[str, Expr], list[tuple[str, int]]]:
    """Simulate the step on `sim`: (totals of parameters, inputs, gradients and optimizer state; the
    storages saved for backward, as (forward node, storage id), each once, parameters not included)."""
    fw_ph = split.fw_inputs
    params = set(param_indices)
    total = {"params": sym(0), "inputs": sym(0), "grads": sym(0), "opt": sym(0)}
    env: dict[str, list[int]] = {}
    held: dict[str, list[Expr]] = {"params": [], "inputs": []}
    for i, n in enumerate(fw_ph):
        if not isinstance(n.meta.get("val"), torch.Tensor):
            continue
        nb = _placeholder_bytes(n)
        held["params" if i in params else "inputs"].append(nb)
        env[n.name] = [sim.new(nb)]   # held by the module (parameters) or the user (the batch)
    total.update({k: sympy.Add(*v) for k, v in held.items()})   # one Add each: += re-flattens every time
    grads = split.bw_outputs if split.bw_inputs is not None else []
    grad_of = trained(fw_ph, params, grads)
    trainable_bytes = sympy.Add(*[_placeholder_bytes(fw_ph[i]) for i in grad_of])
    if optimizer_states(optimizer):
        total["opt"] = optimizer_states(optimizer) * trainable_bytes
        sim.new(total["opt"])
        for _ in grad_of:                      # step counters: one scalar tensor per parameter
            sim.new(sym(4))
    if device.workspace_bytes:
        sim.new(sym(device.workspace_bytes))
    sim.record("start")
    fw_out = split.run_fw(sim, env)
    param_sids = {s for n in fw_ph for s in env.get(n.name, [])}
    sim.user_outputs = {s for sids in fw_out[:num_fwd_outputs] for s in sids if s not in param_sids}
    saved: list[tuple[str, int]] = []
    if split.bw_inputs is not None:
        saved_env: dict[str, list[int]] = {}
        seen: set[int] = set()
        for node, sids in zip(split.fw_outputs[num_fwd_outputs:], fw_out[num_fwd_outputs:]):
            if isinstance(node, fx.Node):
                saved_env[node.name] = sids
                for s in sids:
                    if s not in param_sids and s not in seen:
                        seen.add(s)
                        saved.append((node.name, s))
        # tangents: made by autograd and held by it until the backward returns (the node's arguments); none
        # for the outputs beside the loss that colauto compiles without a gradient (output_grads.UNUSED):
        # their readers read zeros made at the backward's start (`output_grads.specialize`), which
        # Inductor folds into them and the aten graph allocates (freed after its last reader)
        tangents = []
        for n in split.bw_inputs:
            if n.name not in saved_env and isinstance(n.meta.get("val"), torch.Tensor):
                if n.meta.get(UNUSED_GRAD):
                    saved_env[n.name] = [] if sim.fused else [sim.new(_placeholder_bytes(n))]
                    continue
                tangents.append(sim.new(_placeholder_bytes(n)))
                sim.ref(tangents[-1])
                saved_env[n.name] = [tangents[-1]]
        sim.tangents = set(tangents)
        # each saved value's forward-output reference passes to the backward input of that name
        split.run_bw(sim, saved_env)
        for s in tangents:
            sim.unref(s)
        total["grads"] = trainable_bytes
        if optimizer == "adamw_foreach":
            sim.new(trainable_bytes)
        if optimizer != "none":
            sim.record("optimizer")
    return total, saved


def _size_expr(basis: Basis, sparse) -> Expr:
    v = np.zeros(len(basis.terms))
    for j, c in sparse:
        v[j] += c
    return basis.expr(v)


class _PeakSim(_Sim):
    """The same simulation in bytes at the example sizes only: the peak and where it is, no timeline.
    Cheap enough to run for every candidate plan (predict_partition)."""

    def __init__(self, device: DeviceSpec, hints: dict, fused: bool = False) -> None:
        super().__init__(Basis(), device, fused=fused)
        self.hints, self.memo = hints, {}
        self.state, self.peak, self.peak_at = 0, 0, ""

    def _measure(self, nbytes: Expr) -> int:
        b = self.memo.get(nbytes)
        if b is None:
            b = int(nbytes.xreplace(self.hints)) if nbytes.free_symbols else int(nbytes)
            if not nbytes.free_symbols and self.device.alloc_round > 1:
                b = -(-b // self.device.alloc_round) * self.device.alloc_round
            self.memo[nbytes] = b
        return b

    def new(self, nbytes: Expr) -> int:
        b = self._measure(nbytes)
        self.size.append(b)
        self.refs.append(1)
        self.state += b
        return len(self.size) - 1

    def unref(self, sid: int) -> None:
        self.refs[sid] -= 1
        if self.refs[sid] == 0:
            self.state -= self.size[sid]

    def record(self, label: str) -> None:
        if self.state > self.peak:
            self.peak, self.peak_at = self.state, label

    def _graph_starts(self, tag: str, nodes: list[fx.Node], env: dict[str, list[int]], placeholders_held: bool) -> None:
        pass   # bytes only: `compiled_peak` reads the Timeline of simulate_step

    def record_node(self, tag: str, n: fx.Node) -> None:   # the label made only where the peak moves
        if self.state > self.peak:
            self.record(f"{tag}:{n.name}")


class _LiveSim(_PeakSim):
    """_PeakSim that names each storage (the node that made it; "start" for the step's state: parameters,
    batch, optimizer state, workspace) and keeps the storages live at the peak (`live_at_peak`)."""

    def __init__(self, device: DeviceSpec, hints: dict, fused: bool) -> None:
        super().__init__(device, hints, fused)
        self.owner: list[str] = []    # storage id -> the node that made it
        self.peak_live: list[tuple[str, int]] = []

    def _name_new(self, label: str) -> None:
        self.owner.extend([label] * (len(self.size) - len(self.owner)))

    def record(self, label: str) -> None:
        self._name_new(label)
        if self.state > self.peak:
            self.peak_live = [(self.owner[s], b) for s, (b, r) in enumerate(zip(self.size, self.refs)) if r > 0 and b]
        super().record(label)

    def record_node(self, tag: str, n: fx.Node) -> None:
        self._name_new(f"{tag}:{n.name}")
        if self.state > self.peak:
            self.record(f"{tag}:{n.name}")


def live_at_peak(fw: fx.GraphModule, bw: fx.GraphModule | None, *, param_indices: Sequence[int],
                 num_fwd_outputs: int, device: DeviceSpec, optimizer: str, hints: dict,
                 fused: bool = False) -> tuple[int, str, list[tuple[str, int]]]:
    """simulate_step's peak at the example sizes (`hints`), where it is, and the storages live there as
    (the node that made it, bytes), largest first: the memory model, to compare with an allocator
    snapshot of the real step (bench/peak_snapshot.py)."""
    sim = _LiveSim(device, hints, fused)
    _run_step(sim, _graph_split(fw, bw), param_indices=param_indices, num_fwd_outputs=num_fwd_outputs,
              device=device, optimizer=optimizer)
    return sim.peak, sim.peak_at, sorted(sim.peak_live, key=lambda t: -t[1])


@dataclasses.dataclass(frozen=True)
class PredictedPartition:
    """What `predict_partition` expects torch's default partition of a tagged joint graph to do."""
    peak_bytes: int
    peak_at: str
    saved_bytes: int                 # activations kept for backward (parameters not counted)
    recomputed: frozenset[str]       # forward nodes the backward runs again


def predict_partition(joint: fx.Graph, keep: dict[str, bool], *, num_fwd_outputs: int,
                      param_indices: Sequence[int], device: DeviceSpec, optimizer: str,
                      hints: dict, fused: bool = False, replay: bool = True) -> PredictedPartition:
    """The step's peak under the partition torch's default partitioner makes when the forward nodes in
    `keep` are tagged MUST_SAVE (True) or MUST_RECOMPUTE (False), without running it (it copies and
    recompiles the whole graph: seconds on a 24-layer model, for every candidate plan). The model:
    - a forward node is saved where backward reads it, unless it is tagged MUST_RECOMPUTE or returns a
      tuple (its getitems are saved); a node that is not saved is recomputed in backward, and so are the
      unsaved forward nodes it reads;
    - the forward runs, in graph order, what its outputs and the saved values need;
    - the backward runs its nodes in graph order from the first one that reads a tangent, each preceded
      by the recomputed nodes it needs and has not run yet, in graph order (torch's
      reordering_to_mimic_autograd_engine).
    The same liveness simulation as simulate_step then runs at the example sizes (`hints`); with `fused`
    (Inductor's code), as simulate_step's: each graph's `fused_away` intermediates take no memory, and
    the backward runs recomputed memory-bound groups in `inductor_order`.
    planner.Planner checks the prediction against the real partition of the plan it chooses.
    replay=False: only what is saved and recomputed (the peak and saved bytes are left 0)."""
    nodes = list(joint.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    out_node = nodes[-1]
    tangents = [n for n in nodes if n.op == "placeholder" and n.name.startswith("tangents")]
    primals = [n for n in nodes if n.op == "placeholder" and not n.name.startswith("tangents")]
    backward = [n for n in nodes if n.op == "call_function" and n.meta.get("partitioner_tag") == "is_backward"]
    backward_set = set(backward)
    in_backward = backward_set | set(tangents)
    fw_outputs, grads = list(out_node.args[0][:num_fwd_outputs]), list(out_node.args[0][num_fwd_outputs:])

    def saveable(n: fx.Node) -> bool:
        if n.op == "placeholder":
            return True
        if keep.get(n.name) is False:
            return False
        multi = len(n.users) > 0 and all(u.target is operator.getitem for u in n.users)
        return not multi

    saved: set[fx.Node] = set()
    recomputed: set[fx.Node] = set()
    stack = [a for b in backward for a in b.all_input_nodes if a not in in_backward]
    stack += [g for g in grads if isinstance(g, fx.Node) and g not in in_backward]
    while stack:
        a = stack.pop()
        if a in saved or a in recomputed:
            continue
        if saveable(a):
            saved.add(a)
        else:
            recomputed.add(a)
            stack.extend(x for x in a.all_input_nodes if x not in in_backward)
    if not replay:
        return PredictedPartition(0, "", 0, frozenset(n.name for n in recomputed))
    saved_list = sorted(saved, key=order.get)
    # forward: what the user's outputs and the saved values need
    need: set[fx.Node] = set()
    stack = [a for a in fw_outputs + saved_list if isinstance(a, fx.Node)]
    while stack:
        a = stack.pop()
        if a not in need:
            need.add(a)
            stack.extend(a.all_input_nodes)
    fw_run = [n for n in nodes if n in need and n.op in ("call_function", "get_attr")]
    # backward, ordered as reordering_to_mimic_autograd_engine orders it
    bw_all = sorted(recomputed | set(backward), key=order.get)
    first = min((order[u] for t in tangents for u in t.users if u.op == "call_function"), default=None)
    bw_run: list[fx.Node] = []
    done: set[fx.Node] = set()

    def insert(n: fx.Node) -> None:
        todo, found = [n], set()
        while todo:
            x = todo.pop()
            if x in found or x in done or not (x in recomputed or x in backward_set):
                continue
            found.add(x)
            todo.extend(x.all_input_nodes)
        for x in sorted(found, key=order.get):
            done.add(x)
            bw_run.append(x)
    if first is None:
        bw_run = bw_all
    else:
        for n in bw_all:
            if n.target is torch.ops.aten.copy_.default and order[n] < first:
                insert(n)
        for n in bw_all:
            if order[n] >= first:
                insert(n)
        for g in grads:                 # gradients computed before the first tangent read
            if isinstance(g, fx.Node):
                insert(g)
    fw_virtual: set[fx.Node] = set()
    bw_virtual: set[fx.Node] = set()
    if fused:
        cpu = device.name == "cpu"
        fw_virtual = fused_away_of(fw_run, set(fw_outputs + saved_list), cpu=cpu)
        bw_run = inductor_order_of(bw_run, frozenset(n.name for n in recomputed))
        bw_virtual = fused_away_of(bw_run, {g for g in grads if isinstance(g, fx.Node)}, cpu=cpu)

    def run_fw(s: "_PeakSim", env: dict) -> list[list[int]]:
        s.virtual = fw_virtual
        return s.run_nodes(fw_run, primals, fw_outputs + saved_list, "fwd", env, True)

    def run_bw(s: "_PeakSim", env: dict) -> list[list[int]]:
        s.virtual = bw_virtual
        return s.run_nodes(bw_run, saved_list + tangents, grads, "bwd", env, False)
    sim = _PeakSim(device, hints, fused)
    split = _Split(primals, fw_outputs + saved_list, run_fw, saved_list + tangents, grads, run_bw)
    _, saved_sids = _run_step(sim, split, param_indices=param_indices, num_fwd_outputs=num_fwd_outputs,
                              device=device, optimizer=optimizer)
    return PredictedPartition(sim.peak, sim.peak_at, sum(sim.size[s] for _, s in saved_sids),
                              frozenset(n.name for n in recomputed))
