"""compile_region: an FX graph of fusible aten ops -> one generated Triton kernel behind a callable."""
from __future__ import annotations

import torch
import torch.fx as fx

from . import _triton, autotune, cache, colwise, pointwise, rowwise
from .ir import NotFusible
from .launch import Launch
from .region import analyse
from .tuning import COLUMN_CANDIDATES, INTERPRETER, POINTWISE_CANDIDATES, ROW_CANDIDATES, Tuning


def interpreting() -> bool:
    """Whether kernels run in Triton's interpreter (CPU tensors allowed) rather than compiled for CUDA."""
    return _triton.interpreting()


def available() -> _triton.Availability:
    """Whether generated kernels can run here; falsy with the reason when not (callers then use aten)."""
    return _triton.availability()


def compile_region(graph: fx.Graph | fx.GraphModule, example_inputs, *, tuning: Tuning | None = None) -> "FusedRegion":
    """The region's kernel for inputs like `example_inputs`, planned and loaded now, so an op that is
    not fusible raises `NotFusible` here rather than at the first call. `tuning` fixes the block sizes;
    None times a few on CUDA (autotune), and uses the defaults elsewhere (tuning.INTERPRETER's under
    Triton's interpreter)."""
    ok = available()
    if not ok:
        raise RuntimeError(f"Triton kernels are unavailable: {ok.reason}")
    region = FusedRegion(graph.graph if isinstance(graph, fx.GraphModule) else graph, tuning)
    region.launch_for(list(example_inputs))
    return region


def example(size, stride, dtype: torch.dtype, device) -> torch.Tensor:
    """An input for `check` with no storage, on `device` (CUDA included, GPU or not)."""
    return _triton.example(size, stride, dtype, torch.device(device))


def check(graph: fx.Graph, example_inputs) -> None:
    """Raise `NotFusible` unless the generator can plan this region for inputs like these (any device;
    `example` makes storage-less ones: nothing is compiled or run)."""
    region = analyse(graph, list(example_inputs))
    _kind(region).plan(region, Tuning())


class FusedRegion:
    """Call with tensors in the graph's input order; returns the graph's outputs as a tuple. Each new
    input signature (dtypes, sizes, strides) is planned once; one with the same broadcast pattern and
    contiguity class reuses the same kernel."""

    def __init__(self, graph: fx.Graph, tuning: Tuning | None = None):
        self.graph = graph
        self.tuning = tuning
        self._launches: dict[tuple, Launch] = {}

    def __call__(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.launch_for(tensors).run(tensors)

    def launch_for(self, tensors) -> Launch:
        """The planned launch for these inputs' signature. Inputs may be fake (a trace of the call):
        planning and autotuning then run on real tensors of the same signature."""
        signature = tuple((t.dtype, t.device, t.shape, t.stride()) if isinstance(t, torch.Tensor) else type(t)
                          for t in tensors)
        launch = self._launches.get(signature)
        if launch is None:
            with _triton.outside_tracing():
                launch = self._launches[signature] = _plan(self.graph, _triton.real_like(tensors), self.tuning)
        return launch

    def run_wrapped(self, tensors, wrap_triton) -> tuple[torch.Tensor, ...]:
        """As a call, but launched through torch's `wrap_triton`: the body of a `torch.library.triton_op`,
        which Inductor traces and launches from its own wrapper."""
        return self.launch_for(tensors).run_wrapped(tensors, wrap_triton)


def _plan(graph: fx.Graph, tensors: list, tuning: Tuning | None) -> Launch:
    devices = {t.device for t in tensors if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        raise NotFusible(f"inputs on {sorted(map(str, devices))} are not fusible: a kernel runs on one device")
    if devices and devices.pop().type != "cuda" and not _triton.interpreting():
        raise NotFusible("CPU inputs are not fusible: compiled Triton kernels need CUDA tensors "
                         "(or TRITON_INTERPRET=1)")
    region = analyse(graph, tensors)
    kind = _kind(region)
    launch = kind.plan(region, tuning or (INTERPRETER if _triton.interpreting() else Tuning()))
    if not launch.allocs:
        return launch
    launch.kernel = cache.kernel(launch.spec, kind.emit)
    if tuning is None and autotune.enabled():
        return autotune.fastest(lambda t: kind.plan(region, t), launch.kernel, _CANDIDATES[kind], tensors)
    return launch


_CANDIDATES = {pointwise: POINTWISE_CANDIDATES, rowwise: ROW_CANDIDATES, colwise: COLUMN_CANDIDATES}


def _kind(region):
    """The kernel family for a region: column sums, row reductions, or pointwise."""
    if region.has_column_sum:
        if region.has_reduction:
            raise NotFusible("column sums and row reductions in one region are not fusible")
        return colwise
    return rowwise if region.has_reduction else pointwise
