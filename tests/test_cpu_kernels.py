"""Inductor's CPU kernels of a graph built a few to a C++ unit (colauto_backend/_cpu_kernels.py): the
training step still equals eager, each unit holds several kernels, and a source a shared unit cannot
hold is left to Inductor."""
import collections
import copy

import pytest
import torch

from colauto_backend import _cpu_kernels
from examples.hf_zoo import build_hf


def test_a_graphs_cpu_kernels_are_built_a_few_to_a_unit_and_train_as_eager(monkeypatch):
    from torch._inductor.async_compile import get_compile_threads
    from torch._inductor.codecache import CppPythonBindingsCodeCache
    if get_compile_threads() <= 1:
        pytest.fail("one compile thread: Inductor builds each kernel where it is defined and nothing is batched")
    units = []
    real = CppPythonBindingsCodeCache.load_async.__func__

    def counting(cls, main_code, *args, **kwargs):
        if "colauto_k1::kernel" in main_code:
            units.append(main_code.count("}  // namespace colauto_k"))
        return real(cls, main_code, *args, **kwargs)
    monkeypatch.setattr(CppPythonBindingsCodeCache, "load_async", classmethod(counting))
    before = _cpu_kernels.BATCHED["kernels"]
    model, make = build_hf("llama")
    ref, _ = build_hf("llama")
    batch = make(2, 16)
    compiled = torch.compile(model, backend="colauto", options={"codegen": "inductor"})
    loss = compiled(**batch).loss
    loss.backward()
    ref_loss = ref(**batch).loss
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)
    batched = _cpu_kernels.BATCHED["kernels"] - before
    assert units and sum(units) == batched, (units, batched)
    assert all(n >= 2 for n in units), units              # each unit holds several kernels
    assert len(units) <= 2 * get_compile_threads(), units  # forward and backward: a unit a thread each


def test_a_source_a_shared_unit_cannot_hold_is_left_to_inductor():
    kernel = '#include "prefix.h"\nextern "C"  void  kernel(float* out) { out[0] = 1; }\n'
    includes, body = _cpu_kernels._split(kernel)
    assert includes == ['#include "prefix.h"'] and "void kernel(float* out)" in body and 'extern "C"' not in body
    for bad in (kernel.replace("{ out", "\n#define X 1\n{ out"),                   # a macro would leak into others
                kernel + 'extern "C" void other(float* x) {}\n',                  # a second C symbol
                kernel.replace("kernel(", "entry(")):                             # no kernel( entry
        assert _cpu_kernels._split(bad) is None, bad


def test_a_unit_that_does_not_build_falls_back_to_a_build_a_kernel_and_says_so(monkeypatch):
    """A unit g++ rejects (here: made so on purpose) costs only time: its kernels are built one a unit, as
    Inductor builds them, the step still equals eager, and the fallback is counted and warned about."""
    real = _cpu_kernels.unit_source
    monkeypatch.setattr(_cpu_kernels, "unit_source", lambda cache, kernels: real(cache, kernels) + "\n#error colauto test\n")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
    ref = copy.deepcopy(model)
    x = torch.randn(8, 16)
    monkeypatch.setattr(_cpu_kernels, "UNIT_FAILED", collections.Counter())   # warned once: once more here
    alone = _cpu_kernels.SEPARATE["kernels"]
    compiled = torch.compile(model, backend="colauto", options={"codegen": "inductor"})
    with pytest.warns(UserWarning, match="did not build as one C\\+\\+ unit"):
        compiled(x).square().mean().backward()
    ref(x).square().mean().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5)
    assert sum(_cpu_kernels.UNIT_FAILED.values()) > 0
    assert _cpu_kernels.SEPARATE["kernels"] > alone
