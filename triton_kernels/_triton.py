"""The one place triton_kernels touches Triton and private PyTorch APIs (Triton 3.6-3.9, torch 2.11-2.13).

Triton is imported lazily, so importing the package costs nothing where Triton is absent.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import torch
import torch.fx as fx


class Availability(NamedTuple):
    ok: bool
    reason: str       # why not, or how kernels run ("compiled for CUDA" / "Triton interpreter")

    def __bool__(self) -> bool:
        return self.ok


@functools.cache
def _load() -> tuple[ModuleType | None, Availability]:
    # Without a GPU, Triton kernels can only run in its interpreter. Triton reads TRITON_INTERPRET when
    # @triton.jit decorates a function (3.4+; earlier releases at import), so it is set before both.
    # A user's explicit TRITON_INTERPRET wins.
    if not torch.cuda.is_available():
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            # triton.language's own @jit helpers were built compiled: the interpreter cannot call them
            return None, Availability(False, "no CUDA device, and Triton was imported before TRITON_INTERPRET=1 "
                                             "was set: set it before starting Python")
        os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        import triton
    except ImportError as e:
        return None, Availability(False, f"triton is not importable ({e})")
    if triton.knobs.runtime.interpret:
        return triton, Availability(True, "Triton interpreter (TRITON_INTERPRET=1)")
    if not torch.cuda.is_available():
        return None, Availability(False, "no CUDA device and TRITON_INTERPRET is not 1")
    return triton, Availability(True, "compiled for CUDA")


def availability() -> Availability:
    return _load()[1]


def interpreting() -> bool:
    triton, ok = _load()
    return bool(ok) and triton.knobs.runtime.interpret


def version() -> str:
    triton, ok = _load()
    return triton.__version__ if ok else "none"


def do_bench(fn) -> float:
    """Median GPU milliseconds of fn (a short run: launch-shape search), replayed as a CUDA graph: timed
    launch by launch, a small kernel measures the CPU's launch cost, the same for every shape."""
    triton, _ = _load()
    torch.cuda.synchronize()        # it times on a side stream: the inputs must be ready first
    return triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median")


def launcher(compiled, grid):
    """A direct launcher for `compiled` (what `kernel[grid](...)` returned) over `grid`: it skips the
    JIT's per-call argument binding and cache lookup, the bulk of Triton's launch cost. It takes every
    kernel argument in order, constexprs included (Triton >= 3.3 launchers ignore those), and is only
    valid for arguments that specialize as the first call's did (see compile.Launch). None where there
    is nothing to launch directly (the interpreter returns no compiled kernel)."""
    if compiled is None or not hasattr(compiled, "run") or interpreting():
        return None
    return compiled[tuple(grid) + (1,) * (3 - len(grid))]


def outside_tracing():
    """A context in which no tracing or fake mode is active (torch's dispatch modes set aside): a kernel
    planned while Inductor traces a custom op (fake inputs) is planned and autotuned here, on real
    tensors of the same signature (`real_like`)."""
    from torch.utils._python_dispatch import _disable_current_modes
    return _disable_current_modes()


def real_like(tensors) -> list:
    """Uninitialized real tensors with the sizes, strides, dtypes and devices of `tensors` (call it
    `outside_tracing`)."""
    return [torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=t.device)
            if isinstance(t, torch.Tensor) else t for t in tensors]


def load_module(path: Path, name: str) -> ModuleType:
    """Import a generated kernel file. @triton.jit reads the function's source back from the file."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module       # Triton resolves a kernel's globals through its module
    spec.loader.exec_module(module)
    return module


def op_name(target) -> str:
    """`aten.add.Tensor` for an aten overload, else the callable's name."""
    return str(target) if isinstance(target, torch._ops.OpOverload) else getattr(target, "__name__", repr(target))


@functools.cache
def _example_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode
    return FakeTensorMode(allow_non_fake_inputs=True)


def example(size, stride, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A storage-less tensor with these sizes, strides, dtype and device (a CUDA one too where there is
    no GPU), for `check`: its ops see the device the region will run on, as a constant's device kwarg does."""
    with _example_mode():
        return torch.empty_strided(size, stride, dtype=dtype, device=device)


def fake_values(graph: fx.Graph, inputs: list[torch.Tensor]) -> dict[fx.Node, Any]:
    """Each node's output as a fake tensor (shape, strides, dtype, device) for these inputs. Fake, not
    meta, tensors: some ops' output dtypes depend on the device (LayerNorm's mean on CPU vs CUDA)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode()
    fakes = iter([mode.from_tensor(t) for t in inputs])
    env: dict[fx.Node, Any] = {}
    with mode:
        for n in graph.nodes:
            if n.op == "placeholder":
                env[n] = next(fakes)
            elif n.op == "call_function":
                env[n] = n.target(*fx.map_arg(n.args, env.__getitem__), **fx.map_arg(n.kwargs, env.__getitem__))
    return env
