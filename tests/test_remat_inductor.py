"""Rematerialization under Inductor codegen, where candidate plans go through Inductor's min-cut
partitioner: gradients equal eager, and the choice is monotone in the budget."""
import numpy as np
import pytest
import torch

import colauto_backend
from colauto_backend import BudgetError
from examples.models import build

OPTIONS = {"codegen": "inductor"}


def budget_range(model, inputs, n):
    with pytest.raises(BudgetError) as err:
        colauto_backend.explain(model, *inputs, budget=1024, options=OPTIONS)
    unconstrained = colauto_backend.explain(model, *inputs, budget="none", options=OPTIONS).peak_with_bytes
    return np.linspace(err.value.smallest_bytes, unconstrained, n).astype(int).tolist()


def test_monotone_under_inductor_codegen():
    model, make = build("gpt2")
    inputs = make(4, 64)
    budgets = budget_range(model, inputs, 8)
    plans = [colauto_backend.explain(model, *inputs, budget=b, options=OPTIONS) for b in budgets]
    peaks = [p.peak_with_bytes for p in plans]
    times = [p.step_time_with_s for p in plans]
    assert all(p <= b for p, b in zip(peaks, budgets))
    assert all(a <= b for a, b in zip(peaks, peaks[1:])), peaks
    assert all(a >= b for a, b in zip(times, times[1:])), times
    assert peaks[0] < peaks[-1] and times[0] > times[-1]


def test_gradients_equal_eager_under_budget_with_inductor():
    model, make = build("gpt2")
    inputs = make(4, 64)
    loss_ref = model(*inputs)
    loss_ref.backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    budget = budget_range(model, inputs, 3)[1]
    plan = colauto_backend.explain(model, *inputs, budget=budget, options=OPTIONS)
    assert plan.recomputed and plan.peak_with_bytes <= budget < plan.peak_without_bytes
    torch._dynamo.reset()
    loss = torch.compile(model, backend="colauto", options=dict(OPTIONS, memory_budget=budget))(*inputs)
    loss.backward()
    torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref[n], atol=1e-5, rtol=1e-4, msg=n)
