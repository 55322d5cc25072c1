"""Choose the plan: each candidate mesh costed with the rematerialization it would need.

Every candidate (a mesh shape with a role per axis) gets a per-device prediction from the rank's
single-device analysis (the cost model at the rank's micro-batch):
- compute: matmul time unchanged (tp multiplies the batch by tp and divides the work by tp); other ops
  scale like their activations.
- activations: unchanged, except those gathered over tp (column inputs; feature shards a mixing op
  reads), held tp-fold (`TPLayout.gathered_fraction`).
- memory: the single-device step's peak with each parameter's terms replaced by the rank's: its local
  shard and optimizer state, and its gathered copy where the backward reads the parameter itself (fp32
  training; under autocast the backward reads the bf16 copy, which the single-device activations already
  hold). The rest is what the single-device step holds at its peak (`Single.held_bytes`: the gradients by
  then, activations, temporaries; at least the saved activations), plus tp's gathered activations.
- communication: the alpha-beta model (comm.py) per parameter and per tp activation crossing.
  Gradient reductions (all-reduce over dp, reduce-scatter over fsdp) are issued as gradients appear
  and waited for at the end of backward, so they hide behind backward compute up to its length;
  fsdp gathers and tp activation collectives sit on the critical path.
- rematerialization: if the prediction is over the budget, the cheapest point of the remat DP's
  Pareto frontier that frees enough activation memory; its recompute time is added. None frees
  enough: the candidate does not fit.
The joint choice is the fastest candidate that fits with its rematerialization. For comparison the
sequential choice (shard first, then rematerialize, as Colossal-Auto does) is the candidate fastest
without recomputation among those that fit without it (all, if none does), then rematerialized; the
joint one is never slower, and is faster where the sharding that is fastest before recomputation is
not the fastest after it.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Callable

import numpy as np
import torch

from .. import graph, planner
from ..analysis import Analysis, layer_of
from ..config import ConfigError
from ..report import fmt_bytes, natural_key
from . import layers
from .comm import Link
from .mesh import Axes
from .plan import ParallelPlan, shard_shape
from .strategy import LayerIO, TPLayout, param_group, placements, plan_for


@dataclasses.dataclass(frozen=True)
class Single:
    """The numbers of the rank's single-device step that the candidates scale."""
    compute_s: float             # forward + backward
    matmul_share: float          # of compute_s
    backward_share: float        # of compute_s
    optimizer_s: float
    trained_bytes: int           # parameters that train (have gradients and optimizer state)
    optimizer_ratio: float       # optimizer state bytes per trained parameter byte
    rest_bytes: int              # the peak less parameters, gradients (all of them) and optimizer state
    saved_bytes: int             # the saved activations
    freed: np.ndarray            # activation bytes each frontier point frees, ascending
    recompute_s: np.ndarray      # its recompute seconds
    layers: dict = dataclasses.field(default_factory=dict)   # layer -> (compute s, matmul s)
    # parameters whose own storage the backward reads (graph.inputs_read_by_backward): an fsdp plan holds
    # their gathered copies from forward to backward
    read_by_backward: frozenset = frozenset()

    @property
    def transient_bytes(self) -> int:
        """The larger of the saved activations and the peak less the model state."""
        return max(self.rest_bytes, self.saved_bytes)

    @property
    def held_bytes(self) -> float:
        """What the single-device step holds at its peak besides parameters and optimizer state: the
        gradients that exist by then and the activations and temporaries; at least the saved activations
        (the end of forward). A plan's peak holds the same with its own parameters and optimizer state
        (`estimate`): its gradients are never larger than the single device's (fsdp computes them whole,
        tp in shards), so this holds for a peak before backward's gradients exist as well as after."""
        return max(self.rest_bytes + self.trained_bytes, self.saved_bytes)

    @property
    def base_bytes(self) -> float:
        """`held_bytes` less the gradients: the layer DP's base, its options' state bytes holding their
        gradients as computed."""
        return self.held_bytes - self.trained_bytes

    def scaled(self, seconds: float, s_act: float) -> float:
        """Seconds of single-device work on a device whose activations are `s_act` times as large:
        matmul time unchanged, the rest scaled like the activations."""
        return seconds * (self.matmul_share + (1 - self.matmul_share) * s_act)

    @classmethod
    def of(cls, analysis: Analysis, names: dict[int, str] | None = None) -> "Single":
        """`names`: input position -> parameter name, for `read_by_backward`."""
        ev = analysis.evaluate(analysis.hints)
        times = ev["_node_times"]
        matmul = np.array([c.kind == "matmul" for c in analysis.costs.nodes], dtype=bool)
        compute = float(times.sum())
        persistent = ev["param_bytes"] + ev["grad_bytes"] + ev["optimizer_state_bytes"]
        frontier, nodes, _ = planner.remat_frontier(analysis.joint, analysis, ev)
        # each point's exact kept bytes (the grid's units misstate them by up to 5%: 11.17 GiB freed by
        # the grid against 10.44 exactly on the 8B), at up to MAX_MODELED points spread over the frontier
        points = np.array(planner.spread_points(len(frontier.memory), planner.MAX_MODELED))
        sizes = np.array([graph.kept_bytes(n, analysis.hints) for n in nodes])
        kept = np.array([sizes[np.array(frontier.keep(p), dtype=bool)].sum() for p in points])
        order = np.argsort(kept.max() - kept)
        per_layer: dict[str, list[float]] = {}
        for n, t, mm in zip(analysis.costs.nodes, times, matmul):
            row = per_layer.setdefault(layer_of(n.module), [0.0, 0.0])
            row[0] += float(t)
            row[1] += float(t) if mm else 0.0
        rest = ev["peak_memory_bytes"] - persistent
        raw = graph.inputs_read_by_backward(analysis.joint.graph) if analysis.joint is not None else ()
        return cls(compute, float(times[matmul].sum()) / compute if compute else 0.0,
                   float(times[~analysis._is_fwd].sum()) / compute if compute else 0.0, ev["est_optimizer_time_s"],
                   ev["grad_bytes"], ev["optimizer_state_bytes"] / max(ev["grad_bytes"], 1),
                   rest, ev["saved_activation_bytes"],
                   (kept.max() - kept)[order], frontier.time[points][order], {k: tuple(v) for k, v in per_layer.items()},
                   frozenset(names[i] for i in raw if i in (names or {})))


@dataclasses.dataclass(frozen=True)
class Estimate:
    axes: Axes
    compute_s: float
    comm_s: float
    recompute_s: float
    optimizer_s: float
    memory_bytes: int            # predicted per-device peak, rematerialization included
    state_bytes: int             # parameters + gradients + optimizer state + gathered parameters
    fits: bool
    fits_without_remat: bool
    comm_total_s: float = 0.0    # every collective's time, hidden or not (comm_s is the exposed part)

    @property
    def time_s(self) -> float:
        return self.compute_s + self.comm_s + self.recompute_s + self.optimizer_s


def param_cost(plan: ParallelPlan, fqn: str, p: torch.Tensor, link: Link,
               read_by_backward: frozenset = frozenset()) -> tuple[float, ...]:
    """(bytes stored, bytes held from forward to backward beyond them, gather seconds, gradient-reduction
    seconds, bytes stored that train, gradient bytes as computed) of one parameter on the rank holding
    the largest shard (torch.chunk's first), each of its collectives issued alone (its own ring latency).
    A gathered copy is held where the backward reads the parameter itself (`read_by_backward`). A frozen
    parameter has no gradient to reduce and no optimizer state."""
    place = plan.layer_places.get(param_group(fqn), "S")
    here, whole, gather, reduce = _param_cost(plan.axes, plan.storage[fqn], plan.compute[fqn], place,
                                              tuple(p.shape), p.element_size(), link)
    gathered = whole if fqn in read_by_backward and whole != here else 0.0   # a new tensor, beside the shard
    return (here, gathered, gather, reduce, here, whole) if p.requires_grad else (here, gathered, gather, 0.0, 0.0, 0.0)


@functools.lru_cache(maxsize=1 << 16)
def _param_cost(axes: Axes, storage: tuple, compute: tuple, place: str, shape: tuple, elem: int,
                link: Link) -> tuple[float, float, float, float]:
    origin = (0,) * len(axes)
    here = math.prod(shard_shape(axes, storage, shape, origin)) * elem
    whole = math.prod(shard_shape(axes, compute, shape, origin)) * elem
    roles = [r for r, _ in axes]
    fsdp = next((n for (r, n), pl in zip(axes, storage) if r == "fsdp"), 1)
    sharded = any(r == "fsdp" and pl != "R" for r, pl in zip(roles, storage))
    dp = dict(axes).get("dp", 1)
    # a parameter replicated over tp whose layer sees batch shards there gets partial gradients: reduce
    # them over tp too (a layer computed redundantly over tp, "R", gets whole ones)
    tp = next((n for (r, n), pl in zip(axes, compute) if r == "tp" and pl == "R"), 1) if place == "S" else 1
    rest = {"dp"} | ({"tp"} if tp > 1 else set())
    if sharded:   # gathered for use; gradient reduce-scattered over fsdp, then all-reduced over dp (and tp)
        f, r = link.over(axes, {"fsdp"}), link.over(axes, rest)
        return here, whole, f.all_gather(whole, fsdp), f.reduce_scatter(whole, fsdp) + r.all_reduce(
            whole / fsdp, dp * tp)
    # replicated on every data axis
    return here, whole, 0.0, link.over(axes, rest | {"fsdp"}).all_reduce(whole, fsdp * dp * tp)


@dataclasses.dataclass(frozen=True)
class LayerCost:
    stored: float                # parameter bytes held
    gathered: float              # gathered copies held from forward to backward (beyond `stored`)
    gather_s: float              # fsdp gathers (exposed)
    reduce_s: float              # gradient reductions (hidden behind backward up to its length)
    compute_s: float
    tp_s: float                  # tensor-parallel activation collectives (exposed)
    extra_bytes: float           # activations held beyond the single-device graph's
    trained: float               # of `stored`, the bytes of parameters that train
    grads: float = 0.0           # gradient bytes as computed (whole where fsdp shards the parameter)

    def state_bytes(self, single: Single) -> float:
        """Parameters, gathered copies held for backward, gradients as computed and optimizer state."""
        return self.stored + self.gathered + self.grads + self.trained * single.optimizer_ratio


def layer_cost(plan: ParallelPlan, group: str, fqns: list[str], params: dict[str, torch.Tensor],
               tp: TPLayout, single: Single, link: Link) -> LayerCost:
    """One layer under `plan`: its parameters' costs, its compute and activations scaled by how it runs
    (tensor-parallel with sequence parallelism: matmuls unchanged, its gathered activations held
    tp-fold; "S": as on one device; "R": the tp group's whole batch, tp-fold), and its tp collectives."""
    c = (np.sum([param_cost(plan, f, params[f], link, single.read_by_backward) for f in fqns], axis=0)
         if fqns else np.zeros(6))
    n_tp = dict(plan.axes).get("tp", 1)
    link = link.over(plan.axes, {"tp"})      # the tp collectives below
    seconds, matmul = single.layers.get(group, (0.0, 0.0))
    io = tp.layers.get(group, LayerIO())
    saved = single.transient_bytes * io.total_bytes / max(tp.total_bytes, 1)   # its share of the activations
    axis = [r for r, _ in plan.axes].index("tp") if n_tp > 1 else None
    if axis is not None and any(plan.compute[f][axis] != "R" for f in fqns):
        held = min(1.0, io.held_fraction)
        compute = matmul + (seconds - matmul) * (1 + held * (n_tp - 1))
        comm = (sum(link.all_reduce(b * n_tp, n_tp) for b in io.row_bytes + io.col_bytes)
                + sum(link.all_gather(b * n_tp, n_tp) for b in io.gathered_bytes))
        extra = (n_tp - 1) * (sum(io.col_bytes) + sum(io.gathered_bytes))
    elif plan.layer_places.get(group, "S") == "R":
        compute, comm, extra = seconds * n_tp, 0.0, (n_tp - 1) * saved
    else:
        compute, comm, extra = seconds, 0.0, 0.0
    return LayerCost(c[0], c[1], c[2], c[3], compute, comm, extra, c[4], c[5])


def switch_cost(plan: ParallelPlan, group: str, tp: TPLayout, link: Link, before: str, after: str) -> float:
    """Moving a layer's input between tp placements: to "R" all-gathers it (its gradient reduce-scatters
    back), to "S" takes the rank's part (its gradient all-gathers)."""
    n_tp = dict(plan.axes).get("tp", 1)
    if before == after or n_tp == 1:
        return 0.0
    link = link.over(plan.axes, {"tp"})
    b = tp.layers.get(group, LayerIO()).input_bytes * n_tp
    return link.all_reduce(b, n_tp) if after == "R" else link.all_gather(b, n_tp)


def groups(params: dict[str, torch.Tensor], tp: TPLayout) -> dict[str, list[str]]:
    """Parameters by layer: those that cannot be placed first (they keep whatever placement reaches
    them, so their position does not matter), then the others in the order the graph runs them."""
    out: dict[str, list[str]] = {}
    for fqn in params:
        out.setdefault(param_group(fqn), []).append(fqn)
    movable = tp.movable()
    rank = {g: i for i, g in enumerate(tp.order)}
    return dict(sorted(out.items(), key=lambda kv: rank.get(kv[0], -1) if kv[0] in movable else -1))


def estimate(plan: ParallelPlan, params: dict[str, torch.Tensor], tp: TPLayout, single: Single,
             link: Link, budget: int | None) -> Estimate:
    costs = {g: layer_cost(plan, g, fqns, params, tp, single, link) for g, fqns in groups(params, tp).items()}
    rest = single.compute_s - sum(single.layers.get(g, (0.0,))[0] for g in costs)   # layers without parameters
    compute = rest + sum(c.compute_s for c in costs.values())
    place, switches, movable = "S", 0.0, tp.movable()
    for g in costs:
        after = plan.layer_places.get(g, "S") if g in movable else place
        switches, place = switches + switch_cost(plan, g, tp, link, place, after), after
    switches += switch_cost(plan, list(costs)[-1], tp, link, place, "S") if costs else 0.0   # output: "S"
    reduce = sum(c.reduce_s for c in costs.values())
    n_tp = dict(plan.axes).get("tp", 1)
    if plan.tensor_parallel and n_tp > 1 and tp.replicated_bytes:   # ops with no DTensor rule: inputs gathered
        switches += link.over(plan.axes, {"tp"}).all_gather(tp.replicated_bytes * n_tp, n_tp)
    comm = (sum(c.gather_s + c.tp_s for c in costs.values()) + switches
            + max(0.0, reduce - compute * single.backward_share))
    trained = sum(c.trained for c in costs.values())
    state = int(sum(c.state_bytes(single) for c in costs.values()))
    extra = sum(c.extra_bytes for c in costs.values())
    s_act = (single.transient_bytes + extra) / max(single.transient_bytes, 1)
    # the single-device peak with the plan's parameters, gathered copies and optimizer state
    grads = sum(c.grads for c in costs.values())
    memory = memory_before = state - int(grads) + int(single.held_bytes + extra)
    limit = math.inf if budget is None else budget * (1 - planner.HEADROOM)
    recompute, fits = 0.0, memory <= limit
    if not fits:
        (recompute, freed), fits = _remat(single, s_act, memory - limit)
        memory = int(memory - freed)
    optimizer = single.optimizer_s * trained / max(single.trained_bytes, 1)
    total_comm = sum(c.gather_s + c.tp_s for c in costs.values()) + switches + reduce
    return Estimate(plan.axes, compute, comm, recompute, optimizer, memory, state, fits,
                    fits and memory_before <= limit, total_comm)


def _remat(single: Single, s_act: float, excess: float) -> tuple[tuple[float, float], bool]:
    """((recompute seconds, bytes freed), enough?) of the cheapest frontier point that frees `excess`
    bytes; if none does, the point that frees most."""
    enough = np.nonzero(single.freed * s_act >= excess)[0]
    k = int(enough[np.argmin(single.recompute_s[enough])]) if len(enough) else len(single.freed) - 1
    return (single.scaled(float(single.recompute_s[k]), s_act), float(single.freed[k]) * s_act), len(enough) > 0


def configure(plan: ParallelPlan, group: str, fqns: list[str], params: dict[str, torch.Tensor], tp: TPLayout,
              tp_on: bool, shard: bool, place: str) -> ParallelPlan:
    """`plan` with one layer set: tensor-parallel or not, sharded on the fsdp axis or replicated, and the
    tp placement of its activations."""
    roles = {f: tp.roles[f] for f in fqns if f in tp.roles} if tp_on else {}
    storage, compute = placements(plan.axes, {f: params[f] for f in fqns}, roles)
    out = dataclasses.replace(plan, storage=plan.storage | storage, compute=plan.compute | compute)
    if not shard and "fsdp" in dict(plan.axes):
        out = layers.replicate(out, fqns)
    if not tp_on:
        out = dataclasses.replace(out, tp_modules={m: r for m, r in out.tp_modules.items()
                                                   if tp.module_groups.get(m) != group})
    if place is None:
        return out
    return dataclasses.replace(out, layer_places=out.layer_places | {group: place})


def mixed(plan: ParallelPlan, params: dict[str, torch.Tensor], tp: TPLayout, single: Single, link: Link,
          budget: int | None) -> ParallelPlan:
    """Layer by layer (layers.solve): sharded on the fsdp axis or replicated, tensor-parallel or not, its
    activations batch-sharded over tp or whole there. Costed as `estimate` costs, except that gradient
    reductions count as all hidden (if every layer replicated would still hide behind backward) or all
    exposed: additive per layer, as the DP needs. `estimate` then ranks the result."""
    axes = dict(plan.axes)
    if "fsdp" not in axes and "tp" not in axes:
        return plan
    backward = single.compute_s * single.backward_share
    everything = layers.replicate(plan, list(params)) if "fsdp" in axes else plan
    hidden = sum(param_cost(everything, f, p, link)[3] for f, p in params.items()) <= backward
    by_group = groups(params, tp)
    movable = tp.movable()
    options = []
    for g, fqns in by_group.items():
        variants = {}
        for tp_on in ((True, False) if "tp" in axes and any(f in tp.roles for f in fqns) else (False,)):
            for shard in (True, False) if "fsdp" in axes else (True,):
                for place in ("S", "R") if "tp" in axes and not tp_on and g in movable else ("S",):
                    pl = configure(plan, g, fqns, params, tp, tp_on, shard, place)
                    c = layer_cost(pl, g, fqns, params, tp, single, link)
                    key = (tp_on, shard, place if g in movable else None)
                    variants[(tuple(pl.storage[f] for f in fqns), tp_on, place)] = layers.Option(
                        c.state_bytes(single) + c.extra_bytes,
                        c.compute_s + c.gather_s + c.tp_s + (0.0 if hidden else c.reduce_s),
                        place if g in movable else None, key)
        options.append(list(variants.values()))
    names = list(by_group)
    limit = math.inf if budget is None else budget * (1 - planner.HEADROOM)

    # cheapest recompute that frees at least x bytes: a suffix minimum over the frontier by bytes freed
    cheapest = np.minimum.accumulate(single.recompute_s[::-1])[::-1]

    def remat(excess: np.ndarray) -> np.ndarray:
        k = np.searchsorted(single.freed, excess)
        out = np.where(k < len(cheapest), cheapest[np.minimum(k, len(cheapest) - 1)], np.inf)
        return np.where(excess <= 0, 0.0, out)
    solved = layers.solve(options, lambda i, a, b: switch_cost(plan, names[min(i, len(names) - 1)], tp, link, a, b),
                          single.base_bytes, limit, remat)
    if solved is None:
        return plan
    for g, o in zip(names, solved[0]):
        plan = configure(plan, g, by_group[g], params, tp, *o.key)
    if "R" not in plan.layer_places.values():   # all batch-sharded: nothing to move, no hooks
        plan = dataclasses.replace(plan, layer_places={})
    return plan


def choose(candidates: list[Axes], params: dict[str, torch.Tensor], tp_layout: Callable[[int], TPLayout],
           analysis: Analysis, link: Link, budget: int | None, names: dict[int, str] | None = None) -> ParallelPlan:
    """The joint choice, its prediction and every candidate's in `plan.predicted`. `tp_layout(size)`
    is the graph's tensor-parallel layout for a tp axis of that size; `names`, the graph's input
    position -> parameter name."""
    start, cpu_start = time.perf_counter(), time.thread_time()
    single = Single.of(analysis, names)
    layouts = {n: tp_layout(n) for n in {dict(axes).get("tp", 1) for axes in candidates}}
    usable = [axes for axes in candidates if not layouts[dict(axes).get("tp", 1)].indivisible]
    if not usable:
        size = dict(candidates[0]).get("tp", 1)
        # ConfigError: one line to the caller of torch.compile too (Dynamo wrapped a ValueError in
        # BackendCompilerFailed: HF Llama, Qwen2, Mistral, Gemma under COLAUTO_MESH=tp=4 with 2 key/value heads)
        raise ConfigError(f"colauto: tp={size} cannot split {layouts[size].indivisible[0]}: set COLAUTO_MESH "
                          "to a tp size that divides every head count, or another role for that axis")
    candidates = usable
    layout = lambda axes: layouts[dict(axes).get("tp", 1)]  # noqa: E731
    uniform = [plan_for(axes, params, layout(axes)) for axes in candidates]
    uniform_estimates = [estimate(p, params, layout(p.axes), single, link, budget) for p in uniform]
    sequential = _sequential(uniform_estimates)
    plans, estimates = [], []
    for u, e_u in zip(uniform, uniform_estimates):
        # the DP's per-layer costs treat gradient reductions as all hidden or all exposed; `estimate`
        # does not, so a mix it ranks slower than the uniform plan gives way to it
        p = mixed(u, params, layout(u.axes), single, link, budget)
        e = e_u if p is u else estimate(p, params, layout(p.axes), single, link, budget)
        keep_uniform = e_u.fits and (not e.fits or e_u.time_s <= e.time_s)
        plans.append(u if keep_uniform else p)
        estimates.append(e_u if keep_uniform else e)
    replicated = [_replicated(p, params, layout(p.axes)) for p in plans]
    fitting = [i for i, e in enumerate(estimates) if e.fits]
    if not fitting:
        least = min(estimates, key=lambda e: e.memory_bytes)
        raise planner.BudgetError(
            f"COLAUTO_MEMORY_BUDGET: no mesh fits {fmt_bytes(budget)} per device; the smallest prediction is "
            f"{fmt_bytes(least.memory_bytes)} ({_mesh(least.axes)}): raise the budget, use more devices or "
            "shrink the batch", int(least.memory_bytes / (1 - planner.HEADROOM)) + 1)
    # On a tie (to the microsecond) the plan with fewer axes in effect wins, then the mesh with fewer
    # axes: a dp=2,fsdp=2 that replicates every layer is dp=4 in effect (an fsdp axis sharding nothing,
    # a tp axis splitting no layer, only split the batch), but reduces its gradients in two collectives.
    effective = [effective_axes(p) for p in plans]
    joint = min(fitting, key=lambda i: (round(estimates[i].time_s, 6), len(effective[i]), len(estimates[i].axes)))
    chosen = estimates[joint]
    predicted = {
        "step_time_s": chosen.time_s, "compute_s": chosen.compute_s, "comm_s": chosen.comm_s,
        "recompute_s": chosen.recompute_s, "optimizer_s": chosen.optimizer_s,
        "memory_bytes": chosen.memory_bytes, "state_bytes": chosen.state_bytes, "budget_bytes": budget,
        "link": link.name,
        "sequential_mesh": None if sequential is None else _mesh(sequential.axes),
        "sequential_step_time_s": None if sequential is None else sequential.time_s,
        "replicated_layers": replicated[joint],
        "tp_off_layers": _tp_off(plans[joint], params, layout(plans[joint].axes)),
        "replicated_ops": list(layout(plans[joint].axes).replicated_ops) if plans[joint].tensor_parallel else [],
        "whole_batch_layers": sorted((g for g, p in plans[joint].layer_places.items() if p == "R"), key=natural_key),
        "comm_total_s": chosen.comm_total_s,
        "effective_mesh": _mesh(effective[joint]),
        "layers": layer_rows(plans[joint], params, layout(plans[joint].axes)),
        "candidates": [dict(mesh=_mesh(e.axes), effective_mesh=_mesh(a), step_time_s=e.time_s, compute_s=e.compute_s,
                            comm_s=e.comm_s, comm_total_s=e.comm_total_s, recompute_s=e.recompute_s,
                            optimizer_s=e.optimizer_s, memory_bytes=e.memory_bytes, state_bytes=e.state_bytes,
                            fits=e.fits, replicated_layers=len(r), uniform=_brief(u))
                       for e, a, r, u in zip(estimates, effective, replicated, uniform_estimates)],
        "solve_s": time.perf_counter() - start,
        "solve_cpu_s": time.thread_time() - cpu_start,   # this thread only: not other processes on the cores, nor threads earlier work left running
    }
    return dataclasses.replace(plans[joint], predicted=predicted)


def effective_axes(plan: ParallelPlan) -> Axes:
    """The mesh the plan is in effect: an fsdp axis that shards no parameter and a tp axis on which no
    layer runs tensor-parallel or on the tp group's whole batch only split the batch, as dp does; all
    such axes and dp merge into one dp axis of their product."""
    dp, kept = 1, []
    for i, (role, size) in enumerate(plan.axes):
        batch_only = (role == "dp" or (role == "fsdp" and all(s[i] == "R" for s in plan.storage.values()))
                      or (role == "tp" and not plan.tensor_parallel))
        if batch_only:
            dp *= size
        else:
            kept.append((role, size))
    return tuple(([("dp", dp)] if dp > 1 or not kept else []) + kept)


def layer_rows(plan: ParallelPlan, params: dict[str, torch.Tensor], tp: TPLayout) -> list[dict]:
    """Per layer (parameter group), in the order the model holds them: its parameter bytes and how the
    plan runs it on each axis that can differ by layer (fsdp: sharded or replicated; tp: tensor-parallel
    or not, and whether it computes on the tp group's whole batch)."""
    axes = [r for r, _ in plan.axes]
    rows: dict[str, dict] = {}
    for fqn, p in params.items():
        g = param_group(fqn)
        row = rows.setdefault(g, {"layer": g, "param_bytes": 0, "sharded": False, "tp": False})
        row["param_bytes"] += p.numel() * p.element_size()
        if "fsdp" in axes and plan.storage[fqn][axes.index("fsdp")] != "R":
            row["sharded"] = True
        if "tp" in axes and plan.compute[fqn][axes.index("tp")] != "R" and fqn in tp.roles:
            row["tp"] = True
    for row in rows.values():
        row["fsdp"] = ("sharded" if row.pop("sharded") else "replicated") if "fsdp" in axes else None
        on = row.pop("tp")
        row["tp"] = None if "tp" not in axes else (
            "tensor-parallel" if on else "whole batch" if plan.layer_places.get(row["layer"]) == "R" else "replicated")
    return list(rows.values())


def _brief(e: Estimate) -> dict:
    """The uniform plan of a mesh (every layer alike) in a few numbers, for the report."""
    return dict(step_time_s=e.time_s, comm_s=e.comm_s, comm_total_s=e.comm_total_s, recompute_s=e.recompute_s,
                memory_bytes=e.memory_bytes, fits=e.fits)


def _replicated(plan: ParallelPlan, params: dict[str, torch.Tensor], tp: TPLayout) -> list[str]:
    """Layers the fsdp axis leaves replicated (none of their parameters sharded on it)."""
    if "fsdp" not in dict(plan.axes):
        return []
    axis = [r for r, _ in plan.axes].index("fsdp")
    return sorted((g for g, fqns in groups(params, tp).items()
                   if any(params[f].dim() for f in fqns) and all(plan.storage[f][axis] == "R" for f in fqns)),
                  key=natural_key)


def _tp_off(plan: ParallelPlan, params: dict, tp: TPLayout) -> list[str]:
    """Layers with tensor-parallel weights that the plan keeps replicated over tp."""
    if "tp" not in dict(plan.axes):
        return []
    axis = [r for r, _ in plan.axes].index("tp")
    return sorted({param_group(f) for f in tp.roles if f in plan.compute and plan.compute[f][axis] == "R"},
                  key=natural_key)


def _sequential(estimates: list[Estimate]) -> Estimate | None:
    """Shard first, then rematerialize: the uniform candidate fastest without recomputation among
    those whose memory fits without it (all of them, if none does), then rematerialized; None if it
    cannot fit."""
    pool = [e for e in estimates if e.fits_without_remat] or estimates
    best = min(pool, key=lambda e: e.time_s - e.recompute_s)
    return best if best.fits else None


def _mesh(axes: Axes) -> str:
    return ",".join(f"{r}={s}" for r, s in axes)
