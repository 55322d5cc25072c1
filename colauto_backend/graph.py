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
    nodes = list(nx.lexicographical_topological_sort(dag, key=lambda n: dag.nodes[n]["order"]))
    index = {n: i for i, n in enumerate(nodes)}
    nbytes = [_kept_bytes(n, subs) for n in nodes]
    quantum = max(1.0, sum(nbytes) / units)
    size, time, inputs, needed, can_keep, can_recompute = [], [], [], [], [], []
    reads_buffer: set[fx.Node] = set()
    for n, b in zip(nodes, nbytes):
        multi = isinstance(n.meta.get("val"), (tuple, list))
        view = isinstance(n.target, torch._ops.OpOverload) and is_aliasing(n.target)
        random = isinstance(n.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in n.target.tags
        if (not view and any(a.name in buffers for a in n.all_input_nodes)) or any(
                a in reads_buffer and isinstance(a.meta.get("val"), (tuple, list)) for a in n.all_input_nodes):
            reads_buffer.add(n)       # the op itself, or a getitem of its tuple
        size.append(round(b / quantum))   # nearest, so the memory axis stays ~`units` long
        time.append(0.0 if view else float(node_time.get(n.name, 0.0)))
        inputs.append(tuple(sorted(index[a] for a in dag.predecessors(n))))
        needed.append(any(is_backward(u) for u in n.users))
        can_keep.append(not multi and not view)       # a tuple is saved through its getitems; a view through its base
        # a random op would change its values; a pinned one is kept if it can be
        can_recompute.append(not random and n not in reads_buffer and not (n.name in pinned and can_keep[-1]))
    kept = tuple(float((keep_time or {}).get(n.name, 0.0)) for n in nodes)
    problem = RematProblem(tuple(size), tuple(time), tuple(inputs), tuple(needed), tuple(can_keep),
                           tuple(can_recompute), kept)
    return problem, nodes, quantum


def _kept_bytes(n: fx.Node, subs: dict) -> float:
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



def read_by_backward_before(joint: fx.Graph, last_backward_node: str) -> frozenset[str]:
    """Forward nodes that some backward node up to `last_backward_node` (joint order) reads."""
    out = set()
    for n in joint.nodes:
        if is_backward(n):
            out.update(a.name for a in n.all_input_nodes if not is_backward(a))
            if n.name == last_backward_node:
                break
    return frozenset(out)
