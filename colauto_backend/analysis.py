"""The cost model of one captured graph: cost table + memory timeline, evaluated at any sizes.

`Analysis.evaluate(subs)` turns the symbolic model into numbers by substituting the few basis terms
and doing matrix products; nothing is traced or walked again, which is what makes `Profile.at` cheap.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Sequence

import numpy as np
import sympy
import torch.fx as fx

from .cost import memory, table
from .cost.device import DeviceSpec
from .cost.poly import Basis
from .cost.shapes import Expr
from .cost.table import layer_of  # noqa: F401  (re-exported: the layer of a module path)

# Under Inductor, the part of a recomputed memory-bound op's input bytes that its fused backward kernel
# reads only because of the recomputation (the rest it reads anyway). A modelling assumption, not a
# measurement: a chain of pointwise ops recomputed inside one kernel reads its materialized inputs once.
# It holds for a value one layer uses. Two cases pay the op's whole cost instead (measured on an H200,
# bench/results/h200x2-2026-11-28-budget-profile: HF Qwen3-0.6B's budgeted step 21 ms slower than the
# unbudgeted, where 2.3 ms were predicted):
# - a value used by several layers (a rotary table, a mask) is recomputed inside each layer's backward
#   kernels: the op's time once per layer (Qwen3: cos/sin re-derived from the positions in 28 layers'
#   attention-backward kernels, +10 ms);
# - a gather at data-dependent addresses (embedding, index) fused into a reduction kernel (Qwen2 and
#   Qwen3: the embedding under layer 0's RMSNorm backward, one 2.4-3.4 ms kernel).
FUSED_RECOMPUTE_FRACTION = 0.1
GATHERS = frozenset({"aten.embedding.default", "aten.index.Tensor", "aten.index_select.default", "aten.gather.default"})


@dataclasses.dataclass
class Analysis:
    costs: table.CostTable
    timeline: memory.Timeline
    basis: Basis
    device: DeviceSpec
    optimizer: str
    sources: dict[sympy.Symbol, tuple[str, int]]   # graph symbol (s77) -> (forward argument, dim)
    hints: dict[sympy.Symbol, int]           # graph symbol -> example size
    cost_s: float                             # wall seconds of analyze()
    joint: fx.GraphModule | None = None       # the graph costed (joint fwd+bwd, or inference)
    fused: bool = False                       # memory modelled for Inductor code (fused intermediates)
    recomputed: frozenset[str] = frozenset()  # forward nodes the backward runs again (the remat plan)
    plan: Any = None                          # the planner.Plan that chose `recomputed`, if any
    planner: Any = None                       # the planner.Planner of this joint graph (plans other budgets)
    codegen: str = ""                         # the code generation that runs the graph ("inductor (auto)": chosen by device)
    cost_cpu_s: float = 0.0                   # CPU seconds of analyze(): unaffected by other processes on the cores
    # per graph ("fwd", "bwd") Inductor compiled: what its generated code allocates and frees
    # (`compat.wrapper_allocations`), recorded when it is compiled; read by `compiled_peak`
    allocations: dict[str, list[tuple[int, str, str]]] = dataclasses.field(default_factory=dict)
    # the planned-graph rules the backward was finally compiled under, where `backend._codegen` compiled it
    # again under the fusion rule (auto rules: its step peaked over the budget); None where it was not
    recompiled_rules: frozenset[str] | None = None

    @functools.cached_property
    def modelled_peak(self) -> int:
        """The memory model's peak of the step at the compile's sizes (`evaluate` at the hints)."""
        return self.evaluate(self.hints)["peak_memory_bytes"]

    def compiled_peak(self, outputs_dropped: bool = False) -> tuple[int, str] | None:
        """The step's peak (bytes, where) at the compile's sizes with each graph run as Inductor's
        generated code allocates and frees (`memory.compiled_peak`; `outputs_dropped`: for a script
        that keeps only the loss); None until the code of every graph of the step was read (a graph
        Inductor did not compile, or took from its cache, has none)."""
        graphs = set(self.timeline.before)
        if not graphs or set(self.allocations) != graphs:
            return None
        return memory.compiled_peak(self.timeline, self.allocations, self.basis.values(self.hints),
                                    self.device.alloc_round, outputs_dropped)

    def repartitioned(self, fw: fx.GraphModule, bw: fx.GraphModule, *, num_fwd_outputs: int,
                      param_indices: Sequence[int], recomputed: frozenset[str]) -> "Analysis":
        """The same cost table with the memory timeline of another partition of the same joint graph."""
        timeline = memory.simulate_step(fw, bw, param_indices=param_indices, num_fwd_outputs=num_fwd_outputs,
                                        basis=self.basis, device=self.device, optimizer=self.optimizer,
                                        fused=self.fused)
        return dataclasses.replace(self, timeline=timeline, recomputed=recomputed)

    @functools.cached_property
    def names(self) -> dict[sympy.Symbol, sympy.Symbol]:
        """Graph symbol (s77) -> readable symbol (idx_0) named after the input it measures."""
        return {s: sympy.Symbol(f"{arg}_{dim}", integer=True, positive=True)
                for s, (arg, dim) in self.sources.items()}

    @functools.cached_property
    def _is_fwd(self) -> np.ndarray:
        return np.array([n.phase == "fwd" for n in self.costs.nodes], dtype=bool)

    @functools.cached_property
    def _is_memory_bound(self) -> np.ndarray:
        return np.array([n.kind == "memory" for n in self.costs.nodes], dtype=bool)

    @functools.cached_property
    def _is_gather(self) -> np.ndarray:
        return np.array([n.op in GATHERS for n in self.costs.nodes], dtype=bool)

    @functools.cached_property
    def extern_read(self) -> tuple[frozenset[str], frozenset[str]]:
        """`memory.extern_read` of the joint graph: the forward values an extern kernel reads in the
        forward (or that it returns), and those it reads in the backward."""
        return memory.extern_read(self.joint.graph) if self.joint is not None else (frozenset(), frozenset())

    @functools.cached_property
    def _read_by_extern_in_backward(self) -> np.ndarray:
        bwd = self.extern_read[1]
        return np.array([n.name in bwd for n in self.costs.nodes], dtype=bool)

    def recompute_times(self, values: np.ndarray, times: np.ndarray, alone: np.ndarray,
                        extern: bool = True) -> np.ndarray:
        """Seconds the backward spends re-running each node (`times`: as the step runs it; `alone`: as
        its own kernel). Under Inductor a recomputed memory-bound op runs inside the fused kernel that
        reads it: a fraction of its input reads, no kernel; a value several layers use, its time as its
        own kernel once per layer; a gather, or a value an extern kernel of the backward reads (a
        LayerNorm or GeLU output a weight gradient's matmul reads: it must be written again), its time
        as its own kernel once (`extern=False`: a fraction of its reads there too, the pricing the planner
        also draws candidates from)."""
        if not self.fused:
            return times
        reads = table._pad(self.costs.read, len(values)) @ values
        fused = FUSED_RECOMPUTE_FRACTION * reads / self.device.bandwidth
        layers = self.costs.layers_using
        whole = np.where(self._is_gather | (layers > 1), layers * alone,
                         np.where(self._read_by_extern_in_backward & extern, alone, fused))
        return np.where(self._is_memory_bound, whole, times)

    def symbolic(self) -> dict[str, Expr]:
        """Totals as sympy expressions over the readable size symbols."""
        fwd = self._is_fwd
        k = len(self.basis.terms)
        flops = table._pad(self.costs.flops, k)
        tl = self.timeline
        exprs = {
            "flops_fwd": self.basis.expr(flops[fwd].sum(0)),
            "flops_bwd": self.basis.expr(flops[~fwd].sum(0)),
            "saved_activation_bytes": tl.saved, "param_bytes": tl.params, "grad_bytes": tl.grads,
            "optimizer_state_bytes": tl.optimizer_state, "input_bytes": tl.inputs,
        }
        return {key: sympy.sympify(e).xreplace(self.names) for key, e in exprs.items()}

    def evaluate(self, subs: dict[sympy.Symbol, int]) -> dict:
        """Every number of a Profile at the sizes `subs` (graph symbol -> int)."""
        values = self.basis.values(subs)
        k = len(values)
        fwd = self._is_fwd
        node_flops = table._pad(self.costs.flops, k) @ values
        alone = self.costs.node_times(values, self.device)     # each op as its own kernel
        times = alone
        if self.fused:   # ops fused into a consumer's kernel launch nothing and write nothing
            times = np.where([n.name in self.timeline.fused for n in self.costs.nodes], 0.0, alone)
        mem = self.timeline.rows @ values if len(self.timeline.rows) else np.zeros(1)
        peak_i = int(np.argmax(mem))
        ev = lambda e: int(round(float(sympy.sympify(e).xreplace(subs))))  # noqa: E731
        params, grads, opt = ev(self.timeline.params), ev(self.timeline.grads), ev(self.timeline.optimizer_state)
        opt_time = _optimizer_moved(self.optimizer, params, grads, opt) / self.device.bandwidth
        again = np.array([n.name in self.recomputed for n in self.costs.nodes], dtype=bool)
        again_times = self.recompute_times(values, times, alone)
        recompute_time = float(again_times[again].sum())
        return {
            "flops_fwd": int(round(node_flops[fwd].sum())),
            "flops_bwd": int(round(node_flops[~fwd].sum())),
            "saved_activation_bytes": ev(self.timeline.saved),
            "peak_memory_bytes": int(round(mem[peak_i])),
            "peak_at": self.timeline.labels[peak_i] if self.timeline.labels else "",
            "param_bytes": params, "grad_bytes": grads, "optimizer_state_bytes": opt,
            "input_bytes": ev(self.timeline.inputs),
            "est_step_time_s": float(times.sum() + opt_time + recompute_time),
            "est_recompute_time_s": recompute_time,
            "est_fwd_time_s": float(times[fwd].sum()),
            "est_bwd_time_s": float(times[~fwd].sum() + recompute_time),
            "est_optimizer_time_s": float(opt_time),
            "unknown_cost_ops": self.costs.unknown_ops(),
            "_node_flops": node_flops, "_node_times": times, "_recompute_times": again_times,
            "_values": values,
        }

    def layers(self, subs: dict[sympy.Symbol, int], ev: dict) -> list[dict]:
        """Per-layer rows: module path (cut after the first layer index), FLOPs, saved bytes, time.
        `ev` is `evaluate(subs)`, which the caller already has."""
        rows: dict[str, dict] = {}
        name_to_layer = {}
        for n, f, t in zip(self.costs.nodes, ev["_node_flops"], ev["_node_times"]):
            layer = layer_of(n.module)
            name_to_layer[n.name] = layer
            r = rows.setdefault(layer, {"module": layer, "flops": 0, "activation_bytes": 0,
                                        "est_time_s": 0.0, "unknown_ops": 0})
            r["flops"] += int(round(f))
            r["est_time_s"] += float(t)
            r["unknown_ops"] += n.kind == "unknown"
        for name, expr in self.timeline.saved_nodes:
            layer = name_to_layer.get(name, "(inputs)")
            r = rows.setdefault(layer, {"module": layer, "flops": 0, "activation_bytes": 0,
                                        "est_time_s": 0.0, "unknown_ops": 0})
            r["activation_bytes"] += int(round(float(sympy.sympify(expr).xreplace(subs))))
        return list(rows.values())


def _optimizer_moved(optimizer: str, params: int, grads: int, opt: int) -> int:
    """Bytes an optimizer step reads and writes: AdamW reads p, g, m, v and writes p, m, v."""
    if optimizer.startswith("adamw"):
        return 2 * params + grads + 2 * opt
    if optimizer == "sgd":
        return 2 * params + grads
    return 0


def analyze(joint: fx.GraphModule, fw: fx.GraphModule | None, bw: fx.GraphModule | None, *,
            num_fwd_outputs: int, param_indices: Sequence[int], device: DeviceSpec, optimizer: str,
            sources: dict, hints: dict, fused: bool = False) -> Analysis:
    """Build the symbolic cost model (timed: this is `timings['cost_s']`, and `['cost_cpu_s']` in CPU seconds)."""
    start, cpu_start = time.perf_counter(), time.thread_time()
    basis = Basis()
    costs = table.build(joint.graph, basis)
    timeline = memory.simulate_step(fw if fw is not None else joint, bw, param_indices=param_indices,
                                    num_fwd_outputs=num_fwd_outputs, basis=basis, device=device,
                                    optimizer=optimizer if bw is not None else "none", fused=fused)
    return Analysis(costs, timeline, basis, device, optimizer, sources, hints, time.perf_counter() - start,
                    joint=joint, fused=fused, cost_cpu_s=time.thread_time() - cpu_start)
