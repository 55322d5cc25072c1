"""An FX graph of aten ops + the tensors it runs on -> a `Region`: primitive instructions and outputs.

Shapes and dtypes come from running the graph on fake tensors with the real inputs' sizes, strides,
dtypes and devices; each node lowers through its rule in pointwise_ops, row_ops or view_ops. A region
with views is then re-expressed over one iteration shape without them (views.flatten).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from . import _triton, pointwise_ops, row_ops, view_ops, views
from ._triton import op_name
from .ir import COLUMN_SUM, REDUCTIONS, Builder, Instr, NotFusible, Ref, prune
from .launch import allocations

RULES = {**pointwise_ops.RULES, **row_ops.RULES, **view_ops.RULES}


@dataclass
class Region:
    inputs: list[torch.Tensor]
    instrs: list[Instr]
    shapes: dict[Ref, tuple[int, ...]]
    outputs: list[Ref]                 # in graph order; Ref("in", k) returns input k itself
    stored: list[tuple[Ref, Any]]      # each computed output once, as the kernel sees it (shape, strides, dtype)
    allocs: list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]]   # stored outputs as eager gives them

    @property
    def has_reduction(self) -> bool:
        return any(i.op in REDUCTIONS for i in self.instrs)

    @property
    def has_column_sum(self) -> bool:
        return any(i.op == COLUMN_SUM for i in self.instrs)


def _check_node(n: fx.Node) -> None:
    if n.op in ("placeholder", "output"):
        return
    if n.op != "call_function":
        raise NotFusible(f"{n.op} node {n.name} ({n.target}) is not fusible: only aten calls are")
    if n.target is not operator.getitem and n.target not in RULES:
        raise NotFusible(f"{op_name(n.target)} is not fusible: it has no Triton lowering")


def analyse(graph: fx.Graph, tensors: list[torch.Tensor]) -> Region:
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(tensors):
        raise ValueError(f"the region has {len(placeholders)} inputs but was given {len(tensors)}")
    for k, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise NotFusible(f"input {k} is a {type(t).__name__}, not a tensor: not fusible")
    for n in graph.nodes:
        _check_node(n)
    vals = _triton.fake_values(graph, tensors)
    b = Builder()
    env: dict[fx.Node, Any] = {n: b.input(k, t) for k, (n, t) in enumerate(zip(placeholders, tensors))}
    for n in graph.nodes:
        if n.op != "call_function":
            continue
        missing = [a for a in n.all_input_nodes if env[a] is None]
        if missing:
            raise NotFusible(f"{n.name} reads {missing[0].name}, an output its op does not compute: not fusible")
        args, kwargs = fx.map_arg(n.args, env.__getitem__), fx.map_arg(n.kwargs, env.__getitem__)
        if n.target is operator.getitem:
            env[n] = args[0][args[1]]         # None for an output the op skips (output_mask)
        else:
            env[n] = RULES[n.target](b, vals[n], *args, **kwargs)
    out_nodes = next(n for n in graph.nodes if n.op == "output").args[0]
    out_nodes = list(out_nodes) if isinstance(out_nodes, (tuple, list)) else [out_nodes]
    outputs = []
    for i, n in enumerate(out_nodes):
        ref = env.get(n) if isinstance(n, fx.Node) else None
        if not isinstance(ref, Ref):
            raise NotFusible(f"output {i} ({n}) is not a tensor the region computes: not fusible")
        outputs.append(ref)
    instrs, renumber = prune(b.instrs, outputs)
    for n, ref in zip(out_nodes, outputs):
        assert ref.kind == "in" or vals[n].dtype == b.dtypes[ref], f"{op_name(n.target)} lowered to {b.dtypes[ref]}"
    outputs = [renumber.get(r, r) for r in outputs]
    # an input nothing reads any more (its readers were pruned) stands in as a 0-dim tensor: no shape to fit
    used = {a for i in instrs for a in i.args if isinstance(a, Ref)} | set(outputs)
    tensors = [t if Ref("in", k) in used else torch.empty((), dtype=t.dtype, device="meta")
               for k, t in enumerate(tensors)]
    shapes = {renumber.get(r, r): s for r, s in b.shapes.items() if r in renumber}
    shapes |= {Ref("in", k): tuple(t.shape) for k, t in enumerate(tensors)}
    if any(i.op in views.OPS for i in instrs):
        inputs, instrs, shapes, outputs, stored, allocs = views.flatten(
            list(tensors), instrs, shapes, outputs, [vals[n] for n in out_nodes])
        return Region(inputs, instrs, shapes, outputs, stored, allocs)
    found: dict[Ref, Any] = {}
    for n, ref in zip(out_nodes, outputs):
        if ref.kind == "t" and ref not in found:
            found[ref] = vals[n]
    stored = list(found.items())
    return Region(list(tensors), instrs, shapes, outputs, stored, allocations(stored))
