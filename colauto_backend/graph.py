"""FX joint graph -> networkx DAG of its forward part -> the plain-array `RematProblem` for the solver.

Sizes and times are the cost model's, evaluated at the example sizes; sizes are quantized to
`units` memory units so the DP's memory axis stays short (the quantum is reported with the plan).
"""
from __future__ import annotations

import functools

import networkx as nx
import numpy as np
import sympy
import torch
import torch.fx as fx

from .cost.flops import is_aliasing
from .cost.shapes import storage_nbytes, tensors_in
from .solver.remat import RematProblem


def is_backward(n: fx.Node) -> bool:
    return n.meta.get("partitioner_tag") == "is_backward"


def forward_dag(joint: fx.Graph) -> nx.DiGraph:
    """Forward call nodes that produce tensors; an edge producer -> consumer for each use."""
    dag = nx.DiGraph()
    order = 0
    for n in joint.nodes:
        if n.op == "call_function" and not is_backward(n) and _produces_tensor(n):
            dag.add_node(n, order=order)
            order += 1
    for n in dag.nodes:
        for a in n.all_input_nodes:
            if a in dag:
                dag.add_edge(a, n)
    return dag


def solver_order(dag: nx.DiGraph) -> list[fx.Node]:
    """The DP's topological order of the forward DAG: the joint graph's, except that a node only the
    backward reads (directly, or through such nodes) comes right after its last input. AOTAutograd
    traces those where the backward uses them (HF BLOOM's GELU derivative, `1 - tanh(x)**2`, at the end
    of the joint graph), so a DP walking from the end held each layer's tanh in its state until it reached
    that layer: the states multiplied layer by layer (2,160 at 4 layers; 24 never finished). The DP is
    exact in any topological order; its state is the demanded tensors live across the cursor, and this
    order keeps such a node's reads short."""
    order = {n: d["order"] for n, d in dag.nodes(data=True)}
    tail: dict[fx.Node, bool] = {}
    for n in sorted(dag.nodes, key=order.get, reverse=True):   # users first: a user's order is larger
        tail[n] = bool(n.users) and all(is_backward(u) or tail.get(u, False) for u in n.users)
    anchor: dict[fx.Node, int] = {}
    for n in sorted(dag.nodes, key=order.get):
        preds = [anchor[p] for p in dag.predecessors(n)]
        anchor[n] = max(preds) if tail[n] and preds else order[n]
    return list(nx.lexicographical_topological_sort(dag, key=lambda n: (anchor[n], order[n])))


def _produces_tensor(n: fx.Node) -> bool:
    val = n.meta.get("val")
    return isinstance(val, torch.Tensor) or (isinstance(val, (tuple, list)) and bool(tensors_in(val)))


def remat_problem(joint: fx.Graph, node_time: dict[str, float], subs: dict, units: int = 512,
                  pinned: frozenset[str] = frozenset(), buffers: frozenset[str] = frozenset(),
                  keep_time: dict[str, float] | None = None) -> tuple[RematProblem, list[fx.Node], float]:
    """The problem over the forward DAG, its nodes in solver order, and the bytes per memory unit.
    `pinned` nodes may not be recomputed (doing so could not lower the peak, see planner). Nor may an
    op that reads a buffer placeholder (BatchNorm running stats): the step updates buffers in place
    after forward, so a recomputation would read the new values (autograd's version check fails)."""
    dag = forward_dag(joint)
    nodes = solver_order(dag)
    index = {n: i for i, n in enumerate(nodes)}
    nbytes = [kept_bytes(n, subs) for n in nodes]
    keepable = [_can_keep(n) for n in nodes]
    quantum = grid_quantum([b for b, k in zip(nbytes, keepable) if k], units)
    size, time, inputs, needed, can_keep, can_recompute = [], [], [], [], [], []
    reads_buffer: set[fx.Node] = set()
    for n, b, k in zip(nodes, nbytes, keepable):
        view = isinstance(n.target, torch._ops.OpOverload) and is_aliasing(n.target)
        random = isinstance(n.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in n.target.tags
        if (not view and any(a.name in buffers for a in n.all_input_nodes)) or any(
                a in reads_buffer and isinstance(a.meta.get("val"), (tuple, list)) for a in n.all_input_nodes):
            reads_buffer.add(n)       # the op itself, or a getitem of its tuple
        # nearest, so the memory axis stays ~`units` long; what cannot be kept takes no memory unit
        size.append(round(b / quantum) if k else 0)
        time.append(0.0 if view else float(node_time.get(n.name, 0.0)))
        inputs.append(tuple(sorted(index[a] for a in dag.predecessors(n))))
        needed.append(any(is_backward(u) for u in n.users))
        can_keep.append(k)
        # a random op would change its values; a pinned one is kept if it can be
        can_recompute.append(not random and n not in reads_buffer and not (n.name in pinned and can_keep[-1]))
    kept = tuple(float((keep_time or {}).get(n.name, 0.0)) for n in nodes)
    problem = RematProblem(tuple(size), tuple(time), tuple(inputs), tuple(needed), tuple(can_keep),
                           tuple(can_recompute), kept)
    return problem, nodes, quantum


def _can_keep(n: fx.Node) -> bool:
    """A tuple is saved through its getitems; a view through its base."""
    multi = isinstance(n.meta.get("val"), (tuple, list))
    return not multi and not (isinstance(n.target, torch._ops.OpOverload) and is_aliasing(n.target))


# Largest share of the keepable bytes that rounding sizes to memory units may misstate, and how far the
# grid may be refined to get there (units x 2**REFINE at most: the DP's time grows with the units).
TOLERANCE = 0.05
REFINE = 3


def grid_quantum(keepable: list[float], units: int = 512) -> float:
    """Bytes per memory unit: the coarsest of units, 2 units, ... units * 2**REFINE equal parts of the
    keepable bytes whose rounding misstates at most TOLERANCE of them (else the finest). Only what can be
    kept counts: views, tuples and values the DP cannot keep no longer coarsen the grid, and a tensor
    below half a unit (counted as free) must be rare enough to stay within the tolerance."""
    b = np.asarray(keepable, dtype=np.float64)
    total = float(b.sum())
    quantum = 1.0
    for step in range(REFINE + 1):
        quantum = max(1.0, total / (units << step))
        if np.abs(np.round(b / quantum) * quantum - b).sum() <= TOLERANCE * total:
            break
    return quantum


def kept_bytes(n: fx.Node, subs: dict) -> float:
    val = n.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return 0.0
    return value_at(storage_nbytes(val), subs)


def value_at(expr, subs: dict) -> float:
    """A size expression at concrete sizes (cached: repeated layers share their expressions)."""
    return _value_at(expr, tuple(subs.items()))


@functools.lru_cache(maxsize=4096)
def _value_at(expr, subs: tuple) -> float:
    return float(sympy.sympify(expr).xreplace(dict(subs)))


def node_times(costs, times: np.ndarray) -> dict[str, float]:
    return {c.name: float(t) for c, t in zip(costs.nodes, times)}



def inputs_read_by_backward(joint: fx.Graph) -> frozenset[int]:
    """Positions of the joint graph's primal inputs whose own storage the backward reads: the input, or a
    view of it, is an input of a backward node. A parameter read only through a cast (autocast's bf16
    copy, which the forward saves) is not one: its backward reads the copy."""
    out = set()
    for i, p in enumerate(n for n in joint.nodes if n.op == "placeholder" and not n.name.startswith("tangents")):
        stack, seen = [p], {p}
        while stack and i not in out:
            for user in stack.pop().users:
                if is_backward(user):
                    out.add(i)
                    break
                if user.op == "call_function" and is_aliasing(user.target) and user not in seen:
                    seen.add(user)
                    stack.append(user)
    return frozenset(out)


def read_by_backward_before(joint: fx.Graph, last_backward_node: str) -> frozenset[str]:
    """Forward nodes that some backward node up to `last_backward_node` (joint order) reads."""
    out = set()
    for n in joint.nodes:
        if is_backward(n):
            out.update(a.name for a in n.all_input_nodes if not is_backward(a))
            if n.name == last_backward_node:
                break
    return frozenset(out)
