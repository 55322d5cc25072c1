"""With COLAUTO_CHUNKED_LOSS=on, under a budget the loss's [N, V] gradient is computed in the forward, in
blocks of rows (colauto_backend/chunked_loss.py): HF causal LMs and the project's GPT-2 train as eager does,
the backward keeps no [N, V] tensor, and the CPU allocator's peak falls by at least one fp32 [N, V] tensor.
It is off by default (its GPU measurement: bench/results/h100-2026-12-07-chunked-loss)."""
import pytest
import torch

from colauto_backend import backend as backend_mod
from colauto_backend import chunked_loss
from examples.hf_zoo import build_hf
from examples.models import build

GENEROUS = "8GiB"    # a budget the unplanned step fits: the rewrite alone, nothing recomputed


@pytest.fixture(autouse=True)
def chunked_loss_on(monkeypatch):
    monkeypatch.setenv("COLAUTO_CHUNKED_LOSS", "on")


def _grads(model):
    out = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def _saved_bytes(analyses) -> int:
    """What the training graph's backward takes from its forward (the memory model of its partition)."""
    return max(a.evaluate(a.hints)["saved_activation_bytes"] for a in analyses if a.planner is not None)


def _head(model, vocab: int) -> int:
    """The output layer's width h: its weight is [V, h]."""
    return next(p.shape[1] for p in model.parameters() if p.dim() == 2 and p.shape[0] == vocab)


@pytest.mark.parametrize("name", ["qwen2", "llama", "gpt_neox", "phi3", "qwen2_moe", "opt", "gpt2-own"])
@pytest.mark.parametrize("codegen", ["aten", "inductor"])
def test_the_loss_gradient_is_computed_in_the_forward_and_trains_like_eager(name, codegen):
    """Loss and every gradient as eager's (fp32: the weight gradient's sum over blocks differs by rounding),
    counted once per model; what the backward takes from the forward falls by an fp32 [N, V] tensor (the
    log-probabilities or logits) less the two products the forward keeps instead, [N, h] and [V, h]."""
    if name == "gpt2-own":      # the project's GPT-2: tied input and output embeddings, its own loss
        model, _ = build("gpt2")
        ref, _ = build("gpt2")
        ref.load_state_dict(model.state_dict())
        idx = torch.randint(0, 512, (4, 64))
        batch, vocab = {"idx": idx, "targets": idx.clone()}, 512
        loss_of = lambda out: out                                            # noqa: E731
    else:
        model, make = build_hf(name)
        ref, _ = build_hf(name)
        batch, vocab = make(4, 64), model.config.vocab_size
        loss_of = lambda out: out.loss                                       # noqa: E731
    rows = 4 * 63 if name != "gpt2-own" else 4 * 64     # HF shifts the labels: 63 predicted tokens a row
    hidden, saved = _head(model, vocab), {}
    for budget, rewrites in ((None, 0), (GENEROUS, 1)):
        torch._dynamo.reset()
        backend_mod.ANALYSES.clear()
        options = {"codegen": codegen} | ({"memory_budget": budget} if budget else {})
        compiled = torch.compile(model, backend="colauto", options=options)
        before = chunked_loss.REWRITTEN["rewritten"]
        loss = loss_of(compiled(**batch))
        loss.backward()
        assert chunked_loss.REWRITTEN["rewritten"] - before == rewrites, (budget, name)
        got = _grads(model)
        want_loss = loss_of(ref(**batch))
        want_loss.backward()
        want = _grads(ref)
        torch.testing.assert_close(loss.detach(), want_loss.detach(), atol=1e-5, rtol=1e-5)
        assert got.keys() == want.keys()
        for key in got:
            torch.testing.assert_close(got[key], want[key], atol=1e-5, rtol=1e-4, msg=key)
        assert not any(a.recomputed for a in backend_mod.ANALYSES)
        saved[budget] = _saved_bytes(backend_mod.ANALYSES)
    assert saved[None] - saved[GENEROUS] >= 4 * (rows * vocab - (rows + vocab) * hidden), saved


def test_the_cpu_allocators_peak_falls_by_the_logits_gradient():
    """The measured peak (every allocation of a step, CPU allocator: bench.cpu_peak) under a budget the
    step fits without recomputing falls by at least one fp32 [N, V] tensor, the math's size of the
    gradient over the logits; the memory model predicts both steps to 0.5% (codegen aten)."""
    from bench import cpu_peak
    model, make = build_hf("qwen2")
    batch = make(8, 256)
    n, vocab = 8 * 255, model.config.vocab_size
    peaks = {}
    for budget in (None, GENEROUS):
        options = {"codegen": "aten"} | ({"memory_budget": budget} if budget else {})
        measured, planned = cpu_peak.measured_step(model, batch, options)
        predicted = max(a.evaluate(a.hints)["peak_memory_bytes"] for a in planned)
        assert predicted == pytest.approx(measured, rel=5e-3), (budget, predicted, measured)
        assert not any(a.recomputed for a in planned)
        peaks[budget] = measured
    assert peaks[None] - peaks[GENEROUS] >= n * vocab * 4, peaks


def test_dynamic_shapes_keep_the_loss_as_it_is():
    """A graph of symbolic sizes is not rewritten (the blocks need the row count), and trains as before."""
    model, make = build_hf("qwen2")
    before = chunked_loss.REWRITTEN["rewritten"]
    compiled = torch.compile(model, backend="colauto", options={"codegen": "aten", "memory_budget": GENEROUS},
                             dynamic=True)
    compiled(**make(2, 16)).loss.backward()
    assert chunked_loss.REWRITTEN["rewritten"] == before


def test_the_report_says_so_and_off_keeps_the_loss(monkeypatch, capsys):
    """COLAUTO_REPORT names the rewrite in the plan's lines; COLAUTO_CHUNKED_LOSS=off (the default) leaves
    the loss as it is under the same budget (the backward takes the [N, V] log-probabilities again)."""
    model, make = build_hf("qwen2")
    batch = make(4, 64)
    monkeypatch.setenv("COLAUTO_REPORT", "1")
    saved = {}
    for setting in ("on", "off", None):
        if setting is None:
            monkeypatch.delenv("COLAUTO_CHUNKED_LOSS")
        else:
            monkeypatch.setenv("COLAUTO_CHUNKED_LOSS", setting)
        torch._dynamo.reset()
        backend_mod.ANALYSES.clear()
        before = chunked_loss.REWRITTEN["rewritten"]
        torch.compile(model, backend="colauto", options={"codegen": "aten", "memory_budget": GENEROUS})(**batch).loss.backward()
        assert chunked_loss.REWRITTEN["rewritten"] - before == (setting == "on")
        said = "the loss's gradient is computed in the forward, in blocks of rows" in capsys.readouterr().out
        assert said == (setting == "on")
        saved[setting] = _saved_bytes(backend_mod.ANALYSES)
    assert saved["off"] == saved[None]
    assert saved["off"] - saved["on"] >= 4 * 4 * 63 * model.config.vocab_size // 2, saved


def test_explain_under_a_budget_plans_the_step_compile_runs():
    """explain() at a budget plans on the rewritten loss, as the compiled step does: the same unplanned
    peak as the compile's plan under that budget; explain() without a budget keeps the loss as traced."""
    import colauto_backend
    model, make = build_hf("qwen2")
    batch = make(4, 64)
    plan = colauto_backend.explain(model, kwargs=batch, budget=GENEROUS, options={"codegen": "aten"})
    unbudgeted = colauto_backend.explain(model, kwargs=batch, budget="none", options={"codegen": "aten"})
    assert plan.chunked_losses == 1 and unbudgeted.chunked_losses == 0
    torch._dynamo.reset()
    backend_mod.ANALYSES.clear()
    compiled = torch.compile(model, backend="colauto", options={"codegen": "aten", "memory_budget": GENEROUS})
    compiled(**batch).loss.backward()
    compiled_plan = next(a.plan for a in backend_mod.ANALYSES if a.plan is not None)
    assert compiled_plan.chunked_losses == 1
    assert plan.peak_without_bytes == compiled_plan.peak_without_bytes < unbudgeted.peak_without_bytes
