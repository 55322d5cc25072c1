"""`profile(model, *example_inputs)`: the symbolic cost model of one training step, without running it.

The model is captured exactly as `torch.compile(model, backend="colauto")` captures it (Dynamo, then
AOTAutograd's joint graph), with every input dimension symbolic; capture stops after the cost model is
built, so no kernel runs (a model on the meta device works). `Profile.at(*inputs)` re-evaluates the
same model at other sizes by substitution only.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import math
import time
import warnings
import weakref
from typing import Any

import sympy
import torch

from . import _torch_compat as compat
from . import config as cfg
from . import meta, planner
from .analysis import Analysis
from .backend import local_backend
from .report import fmt_bytes


class _Captured(Exception):
    """Raised from inside the backend to stop compilation once the analysis exists."""


@dataclasses.dataclass
class Profile:
    flops_fwd: int
    flops_bwd: int
    saved_activation_bytes: int
    peak_memory_bytes: int
    est_step_time_s: float
    details: dict                      # every other evaluated number (memory parts, phase times, ...)
    sizes: dict[str, int]              # readable size symbol -> value these numbers are for
    timings: dict[str, float]          # cost_s: cost model only (cost_cpu_s: its CPU seconds); trace_s: Dynamo + AOT capture; at_s
    _analysis: Analysis = dataclasses.field(repr=False)
    _arg_names: list[str] = dataclasses.field(repr=False)
    _owner: Any = dataclasses.field(default=None, repr=False)   # the model's first parameter (report.shown)

    @property
    def symbolic(self) -> dict[str, sympy.Expr]:
        """The same keys as sympy expressions over the size symbols (peak: at the example's peak step)."""
        exprs = self._analysis.symbolic()
        a = self._analysis
        peak_row = a.timeline.rows[a.timeline.labels.index(self.details["peak_at"])]
        exprs["peak_memory_bytes"] = a.basis.expr(peak_row).xreplace(a.names)
        return exprs

    def at(self, *inputs: Any, **kw_inputs: Any) -> "Profile":
        """The profile for inputs of other sizes (same call signature as the model), by substitution."""
        start = time.perf_counter()
        bound = dict(zip(self._arg_names, inputs)) | kw_inputs
        subs = {}
        for symbol, (name, dim) in self._analysis.sources.items():
            if name not in bound:
                raise ValueError(f"Profile.at: input {name!r} is missing; pass the model's inputs as for the profile")
            subs[symbol] = int(bound[name].shape[dim])
        return _make(self._analysis, subs, self._arg_names,
                     dict(self.timings, at_s=time.perf_counter() - start), self._owner)

    def to_json(self) -> str:
        data = {k: getattr(self, k) for k in ("flops_fwd", "flops_bwd", "saved_activation_bytes",
                                              "peak_memory_bytes", "est_step_time_s", "sizes", "timings")}
        data["details"] = self.details
        data["symbolic"] = {k: str(v) for k, v in self.symbolic.items()}
        return json.dumps(data, indent=1)

    def report(self) -> str:
        from . import report
        return report.shown(report.summary(self._analysis, self._subs()), self._owner)

    def _subs(self) -> dict:
        back = {str(v): k for k, v in self._analysis.names.items()}
        return {back[k]: v for k, v in self.sizes.items()}


def _make(analysis: Analysis, subs: dict, arg_names: list[str], timings: dict, owner: Any = None) -> Profile:
    ev = analysis.evaluate(subs)
    head = ("flops_fwd", "flops_bwd", "saved_activation_bytes", "peak_memory_bytes", "est_step_time_s")
    details = {k: v for k, v in ev.items() if k not in head and not k.startswith("_")}
    sizes = {str(analysis.names.get(s, s)): v for s, v in subs.items() if s in analysis.names}
    return Profile(**{k: ev[k] for k in head}, details=details, sizes=sizes, timings=timings,
                   _analysis=analysis, _arg_names=arg_names, _owner=owner)


def capture(model: torch.nn.Module, example_inputs: tuple, options: dict | None,
            kwargs: dict | None = None, dynamic: bool = True) -> tuple[Analysis, list[str]]:
    """Run Dynamo + AOTAutograd + the cost model (and planner) on `model`, stopping before any kernel.
    `dynamic`: every input dimension a size symbol (profile(): a cost model for every size); else these
    sizes alone (explain(): the same numbers at these sizes, traced without symbolic arithmetic, which
    took half of a 22-layer model's capture)."""
    # the profile is returned to the caller, who prints it (Profile.report) if they want it
    config = dataclasses.replace(cfg.load(options), report=None)
    kwargs = kwargs or {}
    arg_names = [p for p in inspect.signature(model.forward).parameters][: len(example_inputs)]
    captured: list[Analysis] = []

    def stop(analysis: Analysis) -> None:
        captured.append(analysis)
        raise _Captured()

    compiled = torch.compile(model, backend=local_backend(config, on_analysis=stop), fullgraph=True)
    on_meta = meta.on_meta(*example_inputs, *kwargs.values(), next(model.parameters(), None))
    try:
        with compat.no_duck_sizing(), compat.every_dim_dynamic([*example_inputs, *kwargs.values()] if dynamic else []), \
                compat.sizes_forgotten(static=not dynamic), compat.logging_ignored(), meta.gpu_attention(on_meta), \
                planner.gc_off(), \
                warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            compiled(*example_inputs, **kwargs)   # stops inside the backend once the analysis exists
    except Exception as exc:  # noqa: BLE001 - unwrap Dynamo's wrapper, re-raise anything else
        inner = compat.unwrap_backend_error(exc)
        if not isinstance(inner, _Captured):
            raise inner if inner is not exc else exc
    if not captured:
        raise RuntimeError("colauto.profile: the model produced no graph to profile (is forward empty?)")
    analysis = captured[0]
    trainable = torch.is_grad_enabled() and any(p.requires_grad for p in model.parameters())
    # An op without an autograd kernel for these tensors (a custom op with no derivative registered; before
    # meta.gpu_attention restored it, aten.nll_loss on the meta device) is traced with a backward that stops
    # there: parameters behind it get no gradient, silently. It warns; where every trainable parameter still
    # got its gradient, the backward is whole.
    no_autograd = [str(w.message).split(": ")[0] for w in seen if "autograd kernel was not registered" in str(w.message)]
    trainable_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    grads = analysis.evaluate(analysis.hints)["grad_bytes"] if trainable and no_autograd else None
    if trainable and (analysis.timeline.grads == 0 or (no_autograd and grads < trainable_bytes)):
        where = (f"{no_autograd[0]} has no autograd kernel here, and {fmt_bytes(trainable_bytes - grads)} of "
                 "parameters get no gradient" if no_autograd else "it computes no parameter gradient")
        raise RuntimeError(f"colauto.profile: the captured backward is incomplete ({where}): register the op's "
                           "derivative (torch.library.register_autograd), or profile a model.to_empty(device='cpu') "
                           "copy if only its meta kernel lacks one")
    for w in seen:        # the others reach the caller as they would have
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return analysis, arg_names


def profile(model: torch.nn.Module, *example_inputs: Any, options: dict | None = None,
            kwargs: dict | None = None) -> Profile:
    """Capture `model` as torch.compile would and build its cost model at these example sizes.
    `kwargs` are keyword inputs of the model's call (a transformers model's `input_ids=`, `labels=`).

    Every dimension of every tensor input becomes a size symbol (sizes 0 and 1 are specialized by
    Dynamo, so give examples of size >= 2). The model must compile to one graph (no graph breaks).
    Without a memory budget in `options`/COLAUTO_MEMORY_BUDGET the device's memory is the budget, so
    the profile describes the plan torch.compile(backend="colauto") would run.
    """
    start = time.perf_counter()
    analysis, arg_names = capture(model, example_inputs, options, kwargs)
    trace_s = time.perf_counter() - start - analysis.cost_s
    return _make(analysis, analysis.hints, arg_names, {"cost_s": analysis.cost_s, "cost_cpu_s": analysis.cost_cpu_s,
                                                       "trace_s": trace_s},
                 next(model.parameters(), None))


NO_LIMIT = 2 ** 62     # bytes: a budget the user set that no step reaches

# The latest capture explain() made of each model, with what it depends on: another budget for the same
# model, inputs and settings is planned on it without capturing again (its partitions are reused too).
_CAPTURES: "weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple, Analysis]]" = weakref.WeakKeyDictionary()


def _captured(model: torch.nn.Module, example_inputs: tuple, options: dict, kwargs: dict | None) -> Analysis:
    """The unplanned capture of `model` for explain(): reused while the inputs' and parameters' shapes,
    dtypes and requires_grad, the grad mode and every setting but the budget are the same. The shapes are
    in the key, so the capture is static: a size symbol would serve no other size here."""
    def sig(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return (tuple(v.shape), v.dtype, v.device.type, v.requires_grad)
        return repr(v)
    unbudgeted = {**options, "memory_budget": "none"}
    setting = cfg.load(options)
    if setting.memory_budget is not None and setting.memory_budget[0] != "none" and setting.chunked_loss == "on":
        # a budget the user set rewrites the loss (chunked_loss.py) when the step compiles: so does the
        # capture it is planned on, under a budget no step reaches (the real one is planned after)
        unbudgeted["memory_budget"] = NO_LIMIT
    key = (tuple(sig(v) for v in example_inputs), tuple((k, sig(v)) for k, v in (kwargs or {}).items()),
           tuple((n, sig(p)) for n, p in model.named_parameters()), torch.is_grad_enabled(),
           dataclasses.replace(cfg.load(unbudgeted), report=None))
    cached = _CAPTURES.get(model)
    if cached is not None and cached[0] == key:
        return cached[1]
    analysis, _ = capture(model, example_inputs, unbudgeted, kwargs, dynamic=False)
    _CAPTURES[model] = (key, analysis)
    return analysis


def explain(model: torch.nn.Module, *example_inputs: Any, budget: str | float | int | None = None,
            mesh: str | None = None, device: str | None = None, devices: int | None = None,
            options: dict | None = None, kwargs: dict | None = None):
    """The plan colauto would run for this model, without running it.

    Without `mesh`: the rematerialization Plan under `budget` (bytes, '12GiB', a fraction of device
    memory, or 'none'); raises planner.BudgetError if nothing fits. With `mesh` ("8", "2x4",
    "fsdp=2,tp=4", or "auto" with `devices`: every factorization of that many devices): the
    ParallelPlan for that many devices (mesh, placements, and in `.predicted` the per-device step
    time, memory and every candidate mesh), planned in this process; `example_inputs` are one rank's
    micro-batch. `device` names a roofline preset (h100, h200, a100, cpu). `kwargs` are keyword inputs."""
    options = dict(options or {})
    if budget is not None:
        options["memory_budget"] = budget
    if device is not None:
        options["device"] = device
    if mesh is None:
        analysis = _captured(model, example_inputs, options, kwargs)
        if analysis.planner is None:        # an inference graph (no_grad): nothing to recompute
            return analysis.plan
        config = cfg.load(options)
        budget = planner.resolve_budget(config.memory_budget, analysis.device.memory_bytes)
        plan = analysis.planner.plan(budget, partition=False)[0]   # modeled: compile checks the real one
        return dataclasses.replace(plan, chunked_losses=analysis.plan.chunked_losses if analysis.plan else 0)
    from .parallel import entry
    options["mesh"] = mesh
    config = cfg.load(options)
    if config.mesh is None and devices is None:
        raise cfg.ConfigError("mesh='auto' needs devices=N (the number of devices to plan for)")
    world = devices if devices is not None else math.prod(size for _, size in config.mesh)
    return entry.plan_model(model, example_inputs, config, world, kwargs)
