"""Per-node symbolic costs of a joint (or inference) graph: FLOPs, bytes read/written, output bytes.

One `NodeCost` per call node, kept in `node.meta['colauto_cost']` and in a `CostTable` whose
matrices (nodes x basis terms) let any total be evaluated at new sizes by one product. Costs are
cached per (op, argument signature), so the 2nd..Nth copy of a repeated layer costs a dict lookup.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
import sympy
import torch
import torch.fx as fx

from .. import _torch_compat as compat
from . import flops as F
from .device import DeviceSpec
from .poly import Basis
from .shapes import Expr, ZERO, nbytes, shape, tensors_in

META_KEY = "colauto_cost"


@dataclasses.dataclass(frozen=True)
class NodeCost:
    name: str
    op: str
    kind: str        # matmul | memory | view | comm | unknown (see flops.classify)
    phase: str       # fwd | bwd
    module: str      # module path of the forward code this node comes from ("" if none)
    shape: str
    flops: Expr
    read: Expr
    written: Expr
    half: bool       # 16-bit inputs: the device's low-precision matmul rate applies


@dataclasses.dataclass
class CostTable:
    nodes: list[NodeCost]
    basis: Basis
    flops: np.ndarray      # (n_nodes, n_terms)
    moved: np.ndarray      # bytes read + written
    read: np.ndarray       # bytes read
    launches: np.ndarray   # 1 where the node launches a kernel
    half: np.ndarray       # True where the low-precision matmul rate applies
    attention: np.ndarray  # True for fused attention kernels (SDPA forward/backward): the attention rate
    per_key: np.ndarray    # (n_nodes, n_terms): an attention node's FLOPs per key position, else 0
    dropout: np.ndarray    # True for an attention node that applies dropout
    layers_using: np.ndarray   # how many layers read each node's value (at least 1; see _layers_using)

    def unknown_ops(self) -> dict[str, int]:
        return self._count("unknown")

    def comm_ops(self) -> dict[str, int]:
        """Collectives in the graph (data parallelism's gradient all-reduces, ...) and their waits."""
        return self._count("comm")

    def _count(self, kind: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            if n.kind == kind:
                counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    def node_times(self, values: np.ndarray, device: DeviceSpec) -> np.ndarray:
        """Roofline seconds per node at sizes whose basis values are `values` (max of compute, bytes)."""
        k = len(values)
        f = _pad(self.flops, k) @ values
        b = _pad(self.moved, k) @ values
        rate = np.where(self.half, np.where(self.attention, device.attention_rate, device.matmul_flops),
                        device.matmul_flops_fp32)
        fused = self.attention & self.half       # low-precision fused attention: its own model (cost/device.py)
        f = np.where(fused, (f + device.attention_key_overhead * (_pad(self.per_key, k) @ values))
                     * np.where(self.dropout, device.attention_dropout_factor, 1.0), f)
        return np.maximum(f / rate, b / device.bandwidth) + self.launches * device.launch_s


def _pad(mat: np.ndarray, k: int) -> np.ndarray:
    """Columns for basis terms added after the matrix was built are zero."""
    return np.pad(mat, ((0, 0), (0, k - mat.shape[1]))) if mat.shape[1] < k else mat


def _val(a: Any) -> Any:
    if isinstance(a, fx.Node):
        return a.meta.get("val")
    if isinstance(a, (list, tuple)):
        return type(a)(_val(x) for x in a)
    return a


def _signature(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return (shape(a), a.dtype)
    if isinstance(a, (list, tuple)):
        return tuple(_signature(x) for x in a)
    if isinstance(a, torch.SymInt):
        return a.node.expr
    return a if isinstance(a, (int, float, bool, str, type(None), torch.dtype)) else repr(a)


_cache: dict[Any, tuple[str, Expr, Expr, Expr]] = {}


def _node_cost(n: fx.Node) -> tuple[str, Expr, Expr, Expr]:
    args, kwargs, out = _val(n.args), {k: _val(v) for k, v in n.kwargs.items()}, n.meta.get("val")
    key = (n.target, _signature(args), _signature(tuple(sorted(kwargs.items()))), _signature(out))
    hit = _cache.get(key)
    if hit is None:
        kind = F.classify(n.target, makes_tensor=bool(tensors_in(out)))
        if kind == "view":
            hit = (kind, ZERO, ZERO, ZERO)
        else:
            read = sympy.Add(*[nbytes(t) for t in tensors_in(list(args)) + [
                t for v in kwargs.values() for t in tensors_in(v)]])     # one Add: sympy's sum() re-flattens
            written = sympy.Add(*[nbytes(t) for t in tensors_in(out)])
            hit = (kind, F.flops(n.target, args, kwargs, out), read, written)
        _cache[key] = hit
    return hit




def module_path(n: fx.Node) -> str:
    """'transformer.h.3.attn' from Dynamo's nn_module_stack (forward) or fwd_nn_module_stack (backward)."""
    stack = n.meta.get("nn_module_stack") or n.meta.get("fwd_nn_module_stack")
    return compat.stack_module_path(stack) if stack else ""


def build(graph: fx.Graph, basis: Basis) -> CostTable:
    """Cost every call node of `graph` (nodes tagged is_backward count as the backward phase)."""
    nodes, f_rows, m_rows, r_rows, launches, attention, per_key, dropout = [], [], [], [], [], [], [], []
    for n in graph.nodes:
        if n.op != "call_function":
            continue
        kind, fl, rd, wr = _node_cost(n)
        phase = "bwd" if n.meta.get("partitioner_tag") == "is_backward" else "fwd"
        half = any(t.dtype in (torch.bfloat16, torch.float16) for t in tensors_in(list(_val(n.args))))
        cost = NodeCost(n.name, str(n.target), kind, phase, module_path(n), _shape_str(n), fl, rd, wr, half)
        n.meta[META_KEY] = cost
        nodes.append(cost)
        f_rows.append(basis.sparse(fl))
        m_rows.append(basis.sparse(rd + wr))
        r_rows.append(basis.sparse(rd))
        launches.append(0.0 if kind == "view" else 1.0)
        attention.append(F.is_attention(n.target))
        per_key.append(basis.sparse(F.attention_per_key(n.target, _val(n.args))) if attention[-1] else ())
        dropout.append(attention[-1] and F.attention_dropout(n.target, _val(n.args), {k: _val(v) for k, v in n.kwargs.items()}))
    return CostTable(nodes, basis, basis.dense(f_rows), basis.dense(m_rows), basis.dense(r_rows), np.array(launches),
                     np.array([n.half for n in nodes], dtype=bool), np.array(attention, dtype=bool),
                     basis.dense(per_key), np.array(dropout, dtype=bool), _layers_using(graph))


def layer_of(path: str) -> str:
    """'transformer.h.3.attn.c_proj' -> 'transformer.h.3'; paths without an index are kept whole."""
    parts = path.split(".") if path else ["(top level)"]
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:2])


def _layers_using(graph: fx.Graph) -> np.ndarray:
    """Per costed node, how many layers use its value (at least 1): the layers (`layer_of` its users'
    module paths) that the value reaches outside its own, through the forward's views and memory-bound
    ops of its own layer (a rotary table built once, cast, then read by every decoder layer: all of them)."""
    counts = []
    for node in graph.nodes:
        cost = node.meta.get(META_KEY) if node.op == "call_function" else None
        if cost is None:
            continue
        home, layers, todo, seen = layer_of(cost.module), set(), list(node.users), set()
        while todo:
            user = todo.pop()
            c = user.meta.get(META_KEY) if user.op == "call_function" else None
            if c is None or user in seen:
                continue
            seen.add(user)
            if c.phase == "fwd" and (c.kind == "view" or (c.kind == "memory" and layer_of(c.module) == home)):
                todo.extend(user.users)       # a view is read where its users are (one view can serve all layers)
            elif layer_of(c.module) != home:
                layers.add(layer_of(c.module))
        counts.append(max(1, len(layers)))
    return np.array(counts, dtype=float)


def _shape_str(n: fx.Node) -> str:
    ts = tensors_in(n.meta.get("val"))
    return _dims_str(shape(ts[0])) if ts else ""


@functools.lru_cache(maxsize=4096)
def _dims_str(dims: tuple) -> str:      # printing sympy is slow and a graph repeats few shapes
    return "x".join(str(d) for d in dims)
