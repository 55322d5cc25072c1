"""COLAUTO_CUDAGRAPHS=1: the compiled forward and backward graphs replay as CUDA graphs (every codegen:
aten, triton, and Inductor's code, as torch.compile's mode="reduce-overhead" records it).

A fused graph launches hundreds of kernels per step, each through Python (a custom op, a launch lookup,
Triton's launcher; every aten op and view of the graph is a Python call too), so on a slow host the GPU
waits on the CPU. Recorded once and replayed, a graph costs one launch. colauto uses the machinery of
torch.compile's mode="reduce-overhead" (Inductor's CUDA graph trees, behind _torch_compat): the first
calls run the graph as is (kernels compile and autotune then), later ones replay; parameters keep their
addresses, other inputs are copied into the graph's own buffers; outputs live in the trees' memory
pool and are overwritten by the next step's replay (reading an overwritten one raises).

A graph that cannot be recorded runs as before, counted in SKIPPED by reason and warned about once:
inputs not all on CUDA, an op that mutates its inputs or whose output shape depends on data, or
collectives (distributed graphs). An op that *may* have a data-dependent shape (aten.index.Tensor, which
HuggingFace's mask functions call with integer indices) counts only where its traced output has a size
that is not known before it runs (an unbacked symbol): a boolean-mask index does, an integer index does not. A backward is recorded only when its forward was.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

import torch

from . import _torch_compat as compat
from . import counters, report

SKIPPED: Counter = counters.counter("cuda graphs skipped")       # graphs run without CUDA graphs, by reason


class Recorder:
    """Wraps the forward, backward and inference graphs of one torch.compile'd function."""

    def __init__(self, report_setting: str | None = None):
        self.forward_device: int | None = None     # set when the forward was recorded
        self.report_setting = report_setting

    def reason(self, gm: torch.fx.GraphModule, inputs: list, *, is_backward: bool) -> str | None:
        """Why this graph will not be recorded, or None."""
        if is_backward and self.forward_device is None:
            return "its forward runs without CUDA graphs"
        return why_not(gm, inputs)

    def wrap(self, fn: Callable, gm: torch.fx.GraphModule, inputs: list, reason: str | None, *, is_backward: bool,
             is_inference: bool) -> Callable:
        """`fn` recorded, or as it is where `reason` (what `self.reason` said of its graph before code
        generation rewrote it) says why not."""
        kind = "backward" if is_backward else "inference" if is_inference else "forward"
        report.emit_cuda_graphs({"graph": kind, "skipped": reason}, self.report_setting)
        if reason is not None:
            SKIPPED[reason] += 1
            report.warn_once(f"COLAUTO_CUDAGRAPHS=1: a {kind} graph runs without CUDA graphs: {reason}")
            if is_backward and self.forward_device is not None:
                return _after_graphed_forward(fn, self.forward_device)
            return fn
        device = next(t.device.index for t in inputs if isinstance(t, torch.Tensor))
        if not is_backward and not is_inference:
            self.forward_device = device
        return compat.cuda_graph_trees(fn, gm, compat.static_input_indices(gm, is_backward), device_index=device,
                                       is_backward=is_backward, is_inference=is_inference)


def why_not(gm: torch.fx.GraphModule, inputs: list) -> str | None:
    """Why `gm` cannot be recorded as a CUDA graph, or None."""
    devices = sorted({t.device.type for t in inputs if isinstance(t, torch.Tensor)})
    if devices != ["cuda"]:
        return f"its inputs are on {', '.join(devices) or 'no device'} (CUDA graphs need CUDA tensors)"
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.device.type != "cuda":
            return f"{node.name} makes a tensor on {val.device.type}"
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        if target.namespace == "_c10d_functional":
            return "it has collectives (a distributed plan)"
        if target._schema.is_mutable:
            return f"{target} mutates its input in place"
        if torch.Tag.data_dependent_output in target.tags or (
                torch.Tag.dynamic_output_shape in target.tags and compat.has_unbacked_size(val)):
            return f"{target}'s output depends on data (it would synchronize with the CPU)"
    return None


def _after_graphed_forward(fn: Callable, device: int) -> Callable:
    def run(inputs):
        compat.mark_running_backward(device)   # the trees must know the step's backward has started
        return fn(inputs)
    run._boxed_call = True
    return run
