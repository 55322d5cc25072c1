"""profile() and explain() on a model called with keywords, as transformers models are
(`model(input_ids=..., labels=...)`): FLOPs against FlopCounterMode at the example size and, by
substitution (Profile.at), at another size; explain plans a mesh."""
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
