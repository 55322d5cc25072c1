"""Placements for each parameter under a mesh of roles, read off the captured (Dynamo) graph.

tp pairs linear layers Megatron-style: a linear whose input is not feature-sharded becomes column
parallel (weight and bias sharded on the output features; its input gathered over tp), and one whose
input is the feature-sharded result of a column linear (through ops that keep the last dim apart)
becomes row parallel (weight sharded on the input features; its partial-sum output reduce-scattered
back to batch shards: sequence parallelism along the batch dim, emit.py).
A fused projection whose output is split afterwards (GPT-2's qkv) stays replicated: its shards would
not line up with the split, and DTensor would gather the whole output back. Everything else is
replicated on the tp axis. DTensor's own sharding rules then place every intermediate; a pairing
this rule gets wrong costs communication, never correctness.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import torch
import torch.fx as fx
import torch.nn.functional as F

from .. import _torch_compat as compat
from .._torch_compat import example_int
from ..analysis import layer_of
from .mesh import Axes
from .plan import ParallelPlan

_LINEAR = {F.linear, torch._C._nn.linear}
# Ops that combine the features of the last dim: their output is not feature-sharded.
_MIXING = {F.layer_norm, F.rms_norm, F.cross_entropy, F.softmax, F.log_softmax, torch.softmax,
           torch.log_softmax, F.embedding}
_MIXING_METHODS = {"mean", "sum", "softmax", "log_softmax", "norm", "max", "min"}
_SPLITS = {torch.split, torch.chunk, torch.tensor_split}
_SPLIT_METHODS = {"split", "chunk", "tensor_split", "unbind"}


@dataclasses.dataclass
class TPLayout:
    """What tensor parallelism does to one graph: roles of the linear parameters, and the activations
    that cross the tp axis (for the cost model)."""
    roles: dict[str, str]                  # fqn -> "col" | "col_bias" | "row"
    modules: dict[str, str]                # path of the module that calls each linear -> "col" | "row"
    row_outputs: list[fx.Node]             # partial sums, reduce-scattered to batch shards
    col_inputs: list[fx.Node]              # inputs of column linears, gathered over tp (once each)
    gathered: list[fx.Node]                # feature-sharded values a mixing op reads: all-gathered
    gathered_fraction: float               # share of the graph's activation bytes held tp-fold (gathered)
    indivisible: list[str] = dataclasses.field(default_factory=list)   # weights whose heads tp cannot split
    layers: dict[str, "LayerIO"] = dataclasses.field(default_factory=dict)   # per layer (param_group)
    module_groups: dict[str, str] = dataclasses.field(default_factory=dict)  # tp module -> its weight's layer
    total_bytes: int = 0                   # the graph's activation bytes
    order: list[str] = dataclasses.field(default_factory=list)   # layers in the order the graph runs them
    # ops DTensor has no rule for, run replicated over tp (their tensor inputs gathered: `replicated_bytes`
    # a step, at the rank's sizes); set by the caller, which reads them off the joint aten graph
    replicated_ops: tuple[str, ...] = ()
    replicated_bytes: int = 0

    def expanded(self, rename: Callable[[str], list[str]]) -> "TPLayout":
        """The layout of the model whose layers `rename` names (a name of this graph's model -> its names in the
        other: explain's layer expansion, expand_layers.Grown.rename); a layer with several names is repeated.
        The node lists stay this graph's."""
        extra = lambda g: len(rename(g)) - 1    # noqa: E731 - copies a layer gets
        held = self.gathered_fraction * self.total_bytes + sum(
            extra(g) * (sum(io.col_bytes) + sum(io.gathered_bytes)) for g, io in self.layers.items())
        total = self.total_bytes + sum(extra(g) * io.total_bytes for g, io in self.layers.items())
        return dataclasses.replace(
            self, roles={n: r for f, r in self.roles.items() for n in rename(f)},
            modules={n: r for m, r in self.modules.items() for n in rename(m)},
            gathered_fraction=held / total if total else 0.0,
            indivisible=[n for w in self.indivisible for n in rename(w)],
            layers={n: dataclasses.replace(io) for g, io in self.layers.items() for n in rename(g)},
            module_groups={n: group for m, g in self.module_groups.items()
                           for names in [rename(m)] for n, group in zip(names, _padded(rename(g), len(names)))},
            total_bytes=total, order=[n for g in self.order for n in rename(g)])

    def movable(self) -> set[str]:
        """Layers whose activations a plan may place: modules that made nodes of the graph (emission
        hooks them); a parameter group that is not one (root parameters, a weight read directly)
        keeps whatever placement reaches it."""
        return {g for g, io in self.layers.items() if io.total_bytes and g != "(top level)"}


@dataclasses.dataclass
class LayerIO:
    """One layer's share of the layout, for the per-layer DP (choose.mixed)."""
    # tp crossings its weights cause (wherever in the graph they are)
    row_bytes: list[int] = dataclasses.field(default_factory=list)       # row outputs: reduce-scattered
    col_bytes: list[int] = dataclasses.field(default_factory=list)       # column inputs: gathered
    gathered_bytes: list[int] = dataclasses.field(default_factory=list)  # feature shards a mixing op reads
    total_bytes: int = 0          # the layer's activation bytes
    input_bytes: int = 0          # the activations the layer reads from outside it (moved at a cut)

    @property
    def held_fraction(self) -> float:
        """Of the layer's activation bytes, the share held tp-fold under tensor parallelism."""
        return (sum(self.col_bytes) + sum(self.gathered_bytes)) / self.total_bytes if self.total_bytes else 0.0


def tp_layout(gm: fx.GraphModule, names: dict[int, str], size: int) -> TPLayout:
    """The layout for a tp axis of `size`. `names` maps a placeholder's position in the graph to its
    parameter fqn. A column linear whose output is viewed into heads that `size` does not divide (two
    k/v heads over four ranks) is listed in `indivisible`: DTensor cannot shard its gradients' views,
    so that tp size is not offered."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    param_of = {n: names[i] for i, n in enumerate(placeholders) if i in names}
    roles: dict[str, str] = {}
    sharded: set[fx.Node] = set()
    rows, col_inputs, gathered, indivisible = [], [], [], []
    module_groups: dict[str, str] = {}     # module that calls a linear -> group of its weight
    calls: dict[str, str] = {}             # module that calls the linear -> "col" | "row"
    origin: dict[fx.Node, str] = {}        # feature-sharded value -> group of the column weight behind it
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    per: dict[str, LayerIO] = {}
    group = lambda fqn: per.setdefault(param_group(fqn), LayerIO())  # noqa: E731
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in _LINEAR:
            x, w = n.args[0], n.args[1]
            bias = n.args[2] if len(n.args) > 2 else n.kwargs.get("bias")
            wname = param_of.get(w)
            if wname is None or (x not in sharded and _is_split(n)):
                continue
            heads = _heads(n)
            if x not in sharded and heads is not None and heads % size:
                indivisible.append(f"{wname} ({heads} heads)")
                continue
            if x in sharded and roles.get(wname) != "col":
                roles.setdefault(wname, "row")
            else:
                roles.setdefault(wname, "col")
            caller = compat.module_path(n) or wname.rpartition(".")[0]
            calls[caller] = roles[wname]
            module_groups[caller] = param_group(wname)
            if roles[wname] == "col":
                sharded.add(n)
                origin[n] = param_group(wname)
                if x not in col_inputs:
                    col_inputs.append(x)
                    group(wname).col_bytes.append(nbytes(x))
                if bias in param_of:
                    roles[param_of[bias]] = "col_bias"
            else:
                rows.append(n)
                group(wname).row_bytes.append(nbytes(n))
        elif n.op in ("call_function", "call_method") and _inputs(n) & sharded:
            mixing = n.target in _MIXING or (n.op == "call_method" and n.target in _MIXING_METHODS)
            if mixing:
                for a in sorted(_inputs(n) & sharded, key=lambda a: a.name):
                    if a not in gathered:
                        gathered.append(a)
                        per.setdefault(origin[a], LayerIO()).gathered_bytes.append(nbytes(a))
            else:
                sharded.add(n)
                # the latest column output upstream (in a residual stream, the current layer's)
                origin[n] = origin[max((a for a in n.all_input_nodes if a in sharded), key=position.get)]
    total = sum(nbytes(n) for n in gm.graph.nodes if n.op != "placeholder")
    held = sum(nbytes(n) for n in col_inputs + gathered)
    order = _sizes(gm, set(param_of), per)
    return TPLayout(roles, calls, rows, col_inputs, gathered, held / total if total else 0.0, indivisible,
                    per, module_groups, total, order)


def _padded(names: list[str], n: int) -> list[str]:
    """`names` to length n, its last repeated (a module in a cloned layer whose weight's layer is not cloned)."""
    return names + names[-1:] * (n - len(names))


@functools.lru_cache(maxsize=None)
def param_group(fqn: str) -> str:
    """The layer a parameter belongs to ('blocks.3.attn.q.weight' -> 'blocks.3', 'wte.weight' -> 'wte'),
    as analysis.layer_of names the layer of a module."""
    return layer_of(fqn.rpartition(".")[0])


def _sizes(gm: fx.GraphModule, params: set[fx.Node], per: dict[str, LayerIO]) -> list[str]:
    """Each layer's activation bytes and the bytes it reads from outside it, by the module that made
    each node; returns the layers in the order the graph first runs them."""
    where = {n: _layer(n) for n in gm.graph.nodes if n.op != "placeholder"}
    for n, layer in where.items():
        io = per.setdefault(layer, LayerIO())
        io.total_bytes += nbytes(n)
        outside = [a for a in n.all_input_nodes if a not in params and where.get(a) != layer]
        io.input_bytes = max([io.input_bytes] + [nbytes(a) for a in outside])
    return list(dict.fromkeys(where.values()))


def _layer(n: fx.Node) -> str:
    if "colauto_layer" not in n.meta:
        n.meta["colauto_layer"] = layer_of(compat.module_path(n) or "")
    return n.meta["colauto_layer"]


def nbytes(n: fx.Node) -> int:
    """Bytes of a Dynamo graph node's example value (0 for non-tensors); kept in the node's meta, since
    every tp size's layout asks again."""
    if "colauto_nbytes" not in n.meta:
        v = n.meta.get("example_value")
        n.meta["colauto_nbytes"] = math.prod(_shape(v)) * v.element_size() if isinstance(v, torch.Tensor) else 0
    return n.meta["colauto_nbytes"]


def _heads(n: fx.Node) -> int | None:
    """The leading factor a view splits `n`'s last dim into (its heads); None if no view does."""
    val = n.meta.get("example_value")
    width = _shape(val)[-1] if isinstance(val, torch.Tensor) and val.dim() else 1
    for u in n.users:
        out = u.meta.get("example_value")
        if (u.op == "call_method" and u.target in ("view", "reshape") and isinstance(out, torch.Tensor)
                and out.dim() == val.dim() + 1 and _shape(out)[-2] * _shape(out)[-1] == width):
            return _shape(out)[-2]
    return None


def _shape(t: torch.Tensor) -> list[int]:
    return [example_int(s) for s in t.shape]


def _is_split(n: fx.Node) -> bool:
    return any(u.target in _SPLITS or (u.op == "call_method" and u.target in _SPLIT_METHODS) for u in n.users)


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
    has_tp = any(r == "tp" for r, _ in axes)
    storage, compute = placements(axes, params, tp.roles if has_tp else {})
    return ParallelPlan(axes, storage, compute, dict(tp.modules) if has_tp else {})
