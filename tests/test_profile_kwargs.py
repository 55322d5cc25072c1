"""profile() and explain() on a model called with keywords, as transformers models are
(`model(input_ids=..., labels=...)`): FLOPs against FlopCounterMode at the example size and, by
substitution (Profile.at), at another size; explain plans a mesh."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import colauto_backend
from examples import hf_zoo


def _flops(model, batch) -> int:
    with FlopCounterMode(display=False) as counter:
        hf_zoo.loss_of(model(**batch)).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def test_profile_and_explain_take_keyword_inputs():
    model, batch = hf_zoo.build_hf("llama")
    prof = colauto_backend.profile(model, kwargs=batch(2, 16))
    assert prof.flops_fwd + prof.flops_bwd == _flops(model, batch(2, 16))
    assert prof.sizes == {"input_ids_0": 2, "input_ids_1": 16}     # named after the keyword
    other = prof.at(**batch(4, 32))
    assert other.flops_fwd + other.flops_bwd == _flops(model, batch(4, 32))
    plan = colauto_backend.explain(model, kwargs=batch(2, 16), mesh="4", device="h100")
    assert plan.mesh_str and plan.predicted["step_time_s"] > 0


@pytest.mark.parametrize("name", ["qwen2"])     # T5's numbers are the same either way (by hand): no check
def test_explain_plans_the_step_compile_runs_and_profile_leaves_the_inputs_static(name):
    """explain() captures at the inputs' sizes, as torch.compile's first trace does: its single-device plan
    is the one the compile then runs (peak and step time, exactly). A dynamic capture costed HF's
    full-range slices (and their slice_backward copies), which a static trace elides. profile() traces
    every size (its symbols) and leaves the caller's tensors and Dynamo as they were: it once marked the
    tensors dynamic for good, and Dynamo remembered the sizes a capture saw, so a compile after profile()
    or explain() at another batch size traced symbolic sizes. No torch._dynamo.reset() between the calls:
    a script does none."""
    from colauto_backend.backend import ANALYSES
    model, make = hf_zoo.build_hf(name)
    batch, other = make(2, 64), make(3, 48)
    assert colauto_backend.profile(model, kwargs=other).sizes     # size symbols, named after the inputs
    colauto_backend.explain(model, kwargs=other, budget="none")    # another size first
    plan = colauto_backend.explain(model, kwargs=batch, budget="none")
    ANALYSES.clear()
    torch.compile(model, backend="colauto")(**batch).loss.backward()
    ran = next(a for a in ANALYSES if a.planner is not None)
    assert not ran.hints, ran.hints      # no size symbol: the compile traced these sizes
    assert (plan.peak_with_bytes, plan.step_time_with_s) == (ran.plan.peak_with_bytes, ran.plan.step_time_with_s)
