"""Placements for each parameter under a mesh of roles, read off the captured (Dynamo) graph.

tp pairs linear layers Megatron-style: a linear whose input is not feature-sharded becomes column
parallel (weight and bias sharded on the output features), and one whose input is the feature-sharded
result of a column linear (through ops that keep the last dim apart) becomes row parallel (weight
sharded on the input features; its output is a partial sum, all-reduced by DTensor at the next use).
Everything else is replicated on the tp axis. DTensor's own sharding rules then place every
intermediate; a pairing this rule gets wrong costs communication, never correctness.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx
import torch.nn.functional as F

from .mesh import Axes
from .plan import ParallelPlan

_LINEAR = {F.linear, torch._C._nn.linear}
# Ops that combine the features of the last dim: their output is not feature-sharded.
_MIXING = {F.layer_norm, F.rms_norm, F.cross_entropy, F.softmax, F.log_softmax, torch.softmax,
           torch.log_softmax, F.embedding}
_MIXING_METHODS = {"mean", "sum", "softmax", "log_softmax", "norm", "max", "min"}


@dataclasses.dataclass
class TPLayout:
    """What tensor parallelism does to one graph: roles of the linear parameters, and the activations
    that cross the tp axis (for the cost model)."""
    roles: dict[str, str]                  # fqn -> "col" | "col_bias" | "row"
    row_outputs: list[fx.Node]             # partial sums, all-reduced (and their gradients too)
    gathered: list[fx.Node]                # feature-sharded values a mixing op reads: all-gathered
    sharded_fraction: float                # share of the graph's activation bytes that tp shards


def tp_layout(gm: fx.GraphModule, names: dict[int, str]) -> TPLayout:
    """`names` maps a placeholder's position in the graph to its parameter fqn."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    param_of = {n: names[i] for i, n in enumerate(placeholders) if i in names}
    roles: dict[str, str] = {}
    sharded: set[fx.Node] = set()
    rows, gathered = [], []
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in _LINEAR:
            x, w = n.args[0], n.args[1]
            bias = n.args[2] if len(n.args) > 2 else n.kwargs.get("bias")
            wname = param_of.get(w)
            if wname is None:
                continue
            if x in sharded and roles.get(wname) != "col":
                roles.setdefault(wname, "row")
            else:
                roles.setdefault(wname, "col")
            if roles[wname] == "col":
                sharded.add(n)
                if bias in param_of:
                    roles[param_of[bias]] = "col_bias"
            else:
                rows.append(n)
        elif n.op in ("call_function", "call_method") and _inputs(n) & sharded:
            mixing = n.target in _MIXING or (n.op == "call_method" and n.target in _MIXING_METHODS)
            if mixing:
                gathered.extend(a for a in _inputs(n) & sharded if a not in gathered)
            else:
                sharded.add(n)
    total = sum(nbytes(n) for n in gm.graph.nodes if n.op != "placeholder")
    part = sum(nbytes(n) for n in sharded)
    return TPLayout(roles, rows, gathered, part / total if total else 0.0)


def nbytes(n: fx.Node) -> int:
    """Bytes of a Dynamo graph node's example value (0 for non-tensors)."""
    v = n.meta.get("example_value")
    return v.numel() * v.element_size() if isinstance(v, torch.Tensor) else 0


def _inputs(n: fx.Node) -> set[fx.Node]:
    return set(n.all_input_nodes)


def placements(axes: Axes, params: dict[str, torch.Tensor], tp: dict[str, str]) -> tuple[dict, dict]:
    """(storage, compute) placements per fqn for the roles of `axes`. fsdp shards dim 0, or dim 1 where tp
    already shards dim 0: two axes sharding one dim would need DTensor's strided shards to gather."""
    storage, compute = {}, {}
    for fqn, t in params.items():
        tp_place = {"col": "S0", "col_bias": "S0", "row": "S1"}.get(tp.get(fqn, ""), "R")
        st, cp = [], []
        for role, _ in axes:
            if role == "tp":
                st.append(tp_place), cp.append(tp_place)
            elif role == "fsdp" and t.dim() > 0 and not (tp_place == "S0" and t.dim() == 1):
                st.append("S1" if tp_place == "S0" else "S0"), cp.append("R")
            else:   # dp, or nothing left to shard
                st.append("R"), cp.append("R")
        storage[fqn], compute[fqn] = tuple(st), tuple(cp)
    return storage, compute


def plan_for(axes: Axes, params: dict[str, torch.Tensor], tp: TPLayout) -> ParallelPlan:
    storage, compute = placements(axes, params, tp.roles if any(r == "tp" for r, _ in axes) else {})
    return ParallelPlan(axes, storage, compute)
