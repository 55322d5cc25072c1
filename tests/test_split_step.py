"""A memory budget held across the graphs of a training step Dynamo split at a graph break
(colauto_backend/split_step.py), made by a hook (`bench.cpu_peak.graph_break`). Reference: the CPU allocator's own events (torch.profiler with
profile_memory, `bench.cpu_peak.measured_step`: the step's third run, AdamW's moments existing) and eager
PyTorch's training. HF Llama (tiny, fp32, 8 x 256 tokens) with a graph break before its output embedding
(a forward pre-hook, as a user's print or logging call there would make): the step runs as the body, the
output embedding, then the loss, three graphs each planned alone under the budget before, which together
peaked over it at every point tried (32.89 / 28.89 / 21.89 MiB under 29.74 / 23.43 / 17.13 MiB)."""
import os
import warnings

import pytest
import torch

from bench import cpu_peak
from colauto_backend import backend, report, split_step
from examples.hf_zoo import SPECS, build_hf


def _llama_broken_before_its_head():
    model, make = cpu_peak.broken_hf("llama", "head")
    return model, make(8, 256)


def _counts(counter) -> int:
    return sum(counter.values())


def _holds_unwarned(model, batch, codegen: str, budget: int) -> None:
    """The step's third run measures under `budget`, and no graph was warned that it cannot be held (one was,
    which could not be planned again, though the graphs before it had made the room it asked for by then)."""
    unheld = _counts(split_step.UNHELD)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measured, _ = cpu_peak.measured_step(model, batch, {"codegen": codegen, "memory_budget": budget})
    assert measured <= budget, (measured, budget)
    assert _counts(split_step.UNHELD) == unheld


def _budget(model, batch, codegen: str, fraction: float) -> int:
    """`fraction` of the way from what the step holds all along (parameters, gradients, AdamW state) to the
    unplanned step's measured peak."""
    base, planned = cpu_peak.measured_step(model, batch, {"codegen": codegen})
    ev = planned[0].evaluate(planned[0].hints)
    held = ev["param_bytes"] + ev["grad_bytes"] + ev["optimizer_state_bytes"]
    return int(held + fraction * (base - held))


@pytest.mark.parametrize("codegen", ["aten", "inductor"])
def test_a_step_split_at_a_graph_break_holds_the_budget_from_its_second_run(codegen, monkeypatch, tmp_path):
    monkeypatch.setenv("COLAUTO_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("COLAUTO_PLAN_CACHE", "1")
    monkeypatch.setattr(report, "_WARNED", set())
    model, batch = _llama_broken_before_its_head()
    budget = _budget(model, batch, codegen, 0.7)
    short, again = _counts(split_step.SHORT), _counts(split_step.REPLANNED)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        measured, planned = cpu_peak.measured_step(model, batch, {"codegen": codegen, "memory_budget": budget})
    # the first run went over (the body was planned before the later graphs were seen): said so, and the body
    # planned again leaving room, the later graphs under what it leaves
    first = [str(w.message) for w in seen if "is not held by this step's first run" in str(w.message)]
    assert first and "graph break" in first[0], [str(w.message) for w in seen]
    assert _counts(split_step.SHORT) > short and _counts(split_step.REPLANNED) > again
    assert len(planned) >= 2 and sum(len(a.recomputed) for a in planned) > 0   # 3 graphs on torch 2.13, 2 on 2.11
    # torch 2.11 (2 graphs) runs the output embedding eagerly between them: its logits, which the loss graph
    # takes and the script holds, are alive through the body's backward (17.76 MiB under 16.46 until they
    # were counted, 2026-12-07)
    assert measured <= budget, (measured, budget)
    # a later launch plans the body under its kept cap at once: no graph falls short, none is planned again
    torch._dynamo.reset()
    short, again = _counts(split_step.SHORT), _counts(split_step.REPLANNED)
    second, _ = cpu_peak.measured_step(model, batch, {"codegen": codegen, "memory_budget": budget})
    assert (_counts(split_step.SHORT), _counts(split_step.REPLANNED)) == (short, again)
    assert second <= budget, (second, budget)


@pytest.mark.parametrize("name, where", [("llama", "head"), ("t5", "head"), ("vit", "layer")])
def test_a_split_step_planned_again_trains_like_eager(name, where, monkeypatch):
    """The graphs planned again between steps compute what eager PyTorch does: three AdamW steps. A decoder
    and an encoder-decoder broken before their output embedding, a vision model inside its first layer (one
    graph run for each layer)."""
    monkeypatch.setattr(report, "_WARNED", set())
    torch.manual_seed(0)
    model, make = build_hf(name)
    cpu_peak.graph_break(model, where)
    batch = make(8, 32) if SPECS[name].kind == "image" else make(8, 128)
    budget = _budget(model, batch, "aten", 0.6)
    reference, _ = build_hf(name)
    reference.load_state_dict(model.state_dict())
    torch._dynamo.reset()
    shared = _counts(split_step.SHARED)
    compiled = torch.compile(model, backend="colauto", options={"memory_budget": budget})
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, reference)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            losses = []
            for run, opt in zip((compiled, reference), optimizers):
                loss = run(**batch).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(loss.item())
            assert losses[0] == pytest.approx(losses[1], abs=1e-5)
    assert _counts(split_step.SHARED) > shared
    for (pname, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, atol=1e-4, rtol=1e-4, msg=pname)


def test_a_split_step_of_symbolic_sizes_that_cannot_hold_the_budget_fails_in_one_line(monkeypatch):
    """Graphs of symbolic sizes are not planned again: where the later graph's least plan does not fit what
    the body left, a BudgetError names what the earlier graphs hold and the least budget."""
    monkeypatch.setattr(report, "_WARNED", set())
    model, batch = _llama_broken_before_its_head()
    budget = _budget(model, batch, "aten", 0.7)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="colauto", dynamic=True, options={"memory_budget": budget})
    with pytest.raises(RuntimeError) as caught, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled(**batch).loss.backward()
    message = str(caught.value)
    assert "\n" not in message.strip(), message
    assert "cannot be held across the graphs" in message and "graph break" in message, message
    needed = caught.value.smallest_bytes
    assert needed > budget
    assert report.fmt_bytes(needed, up=True) in message


def test_a_graph_run_for_each_layer_of_a_split_step_is_warned_about(monkeypatch):
    """A graph break after a decoder layer makes Dynamo compile the layer's frame once and run it for every
    layer: its plan counted what was held at its first run only. Warned once, counted."""
    monkeypatch.setattr(report, "_WARNED", set())
    torch.manual_seed(0)
    model, make = build_hf("llama")
    cpu_peak.graph_break(model, "layer")
    torch._dynamo.reset()
    before = _counts(split_step.RERUN)
    compiled = torch.compile(model, backend="colauto", options={"memory_budget": "1GiB"})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        compiled(**make(2, 32)).loss.backward()
    got = [str(w.message) for w in seen if "runs again in one training step" in str(w.message)]
    assert len(got) == 1 and "1 earlier run(s)" in got[0], [str(w.message) for w in seen]
    assert _counts(split_step.RERUN) == before + 1


def test_what_eager_code_leaves_between_the_graphs_counts_as_held(monkeypatch, tmp_path):
    """HF GPT-NeoX broken after its first layer: Dynamo runs its embedding and a layer norm eagerly between
    the graphs, and an inference graph makes the attention mask; each is a later graph's input that no
    graph made, alive while the earlier runs are pending (1.5 MiB at the peak, found by walking the CPU
    allocator's events). Counted as held since 2026-12-07: at 0.9 of the way to the unbudgeted peak under
    aten the step measured 27.82 MiB under a 27.34 MiB budget before, with only the first run's warning."""
    monkeypatch.setenv("COLAUTO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(report, "_WARNED", set())
    torch.manual_seed(0)
    model, make = build_hf("gpt_neox")
    cpu_peak.graph_break(model, "layer")
    batch = make(8, 256)
    budget = _budget(model, batch, "aten", 0.9)
    _holds_unwarned(model, batch, "aten", budget)


def test_a_step_split_by_data_dependent_branching_shares_the_budget(monkeypatch):
    """`if tensor.sum() > 0:` in the forward: Dynamo compiles the graph before it at once, and records the break
    only as "unimplemented" by then. Both graphs must be a split step's (the later one planned under what the
    earlier holds, counted in SHARED); before 2026-12-07 neither was, silently."""
    monkeypatch.setattr(report, "_WARNED", set())

    class Branching(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)

        def forward(self, x):
            h = self.a(x).relu()
            if h.sum() > 0:     # data-dependent branching: a graph break
                h = h * 2
            return self.b(h).sum()
    torch.manual_seed(0)
    model, x = Branching(), torch.randn(32, 64)
    shared = _counts(split_step.SHARED)
    compiled = torch.compile(model, backend="colauto", options={"memory_budget": "1GiB"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled(x).backward()
    assert _counts(split_step.SHARED) > shared
    eager = Branching()
    eager.load_state_dict(model.state_dict())
    grads = [p.grad.clone() for p in model.parameters()]
    eager(x).backward()
    for got, want in zip(grads, (p.grad for p in eager.parameters())):
        torch.testing.assert_close(got, want)


def test_a_graph_run_for_each_layer_counts_every_layers_parameters(monkeypatch, tmp_path):
    """A step split inside a layer the model repeats runs one graph for each layer, each run taking that layer's
    parameters; eager code between the graphs (the embedding: Dynamo runs the frame whose loop breaks eagerly)
    uses others no graph takes. All of them, with their AdamW state and the gradients the backwards before have
    made, are alive through each backward. Before 2026-12-08 only the parameters of the graphs pending at a
    graph's compile counted (HF OPT under transformers 5.17 on an H100: 23.48 GiB under a 19.1 GiB budget,
    nothing planned, no warning). HF Llama of 6 layers where its parameters weigh (2 x 64 tokens), broken in
    its first layer, 0.7 of the way to the unbudgeted peak under aten: 7.58 MiB under 6.53 MiB before, silently.
    Reference: the CPU allocator's events (the third step)."""
    monkeypatch.setenv("COLAUTO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(report, "_WARNED", set())
    model, make = cpu_peak.broken_hf("llama", "layer", layers=6)
    batch = make(2, 64)
    base, _ = cpu_peak.measured_step(model, batch, {"codegen": "aten"})
    held = 4 * sum(p.numel() * p.element_size() for p in model.parameters())   # with gradients, AdamW's two
    budget = int(held + 0.7 * (base - held))
    _holds_unwarned(model, batch, "aten", budget)


def test_an_inference_graph_of_a_split_step_is_not_warned_as_unshared(monkeypatch):
    """A graph of a split step that trains nothing (HF OPT's attention mask under transformers 5.17) saves
    nothing for a backward: what it returns counts as the later graphs' input (`split_step`). It was warned as
    planned under the whole budget (on an H100 beside OPT's real shortfall, which it named wrongly); the
    training graphs share the budget, none is warned so."""
    monkeypatch.setattr(report, "_WARNED", set())

    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(64, 64)

        def forward(self, x):
            mask = (x > 0).float()
            torch._dynamo.graph_break()
            return self.lin(x * mask).sum()
    torch.manual_seed(0)
    torch._dynamo.utils.counters.clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.compile(Masked(), backend="colauto", options={"memory_budget": "1GiB"})(torch.randn(32, 64)).backward()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2
    assert not [w for w in seen if "planned under the whole memory budget" in str(w.message)]



def test_a_compile_outside_dynamo_compiles_the_backward_for_the_strides_inductor_padded():
    """A split step's graph planned again at its call is compiled outside Dynamo's compile (split_step.Graph):
    without the TracingContext Dynamo provides, AOTAutograd compiled the backward for contiguous saved
    tensors, and where Inductor padded one (a stride of 1,025 elements to 1,040: HF's loss pads the labels
    to T + 1) the backward failed its first run (HF OPT under transformers 5.17 on an H100, 2026-12-07).
    Padding is what a GPU gets by default; here it is turned on for the CPU. Reference: eager gradients,
    and the same compile without the context failing."""
    import torch._inductor.config as inductor_config
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._inductor.compile_fx import compile_fx_inner

    from colauto_backend import _torch_compat as compat

    class Padded(torch.nn.Module):
        def forward(self, x, w):
            y = torch.nn.functional.pad(x, (0, 1)) * 2      # (4, 1025): saved for the backward, padded
            return ((y.sin() * w).sum(),)

    def grads(context) -> list:
        torch.manual_seed(0)
        x, w = torch.randn(4, 1024, requires_grad=True), torch.randn(4, 1025, requires_grad=True)
        # Inductor's own config.patch: monkeypatch's undo deleted the option from its config module (every
        # later Inductor compile in that test process failed: "disable_padding_cpu does not exist")
        with context, inductor_config.patch(disable_padding_cpu=False):
            fn = aot_module_simplified(torch.fx.symbolic_trace(Padded()), [x, w], fw_compiler=compile_fx_inner,
                                       bw_compiler=compile_fx_inner)
        fn(x, w)[0].backward()
        return [x.grad, w.grad]
    import contextlib
    with pytest.raises(Exception, match="stride"):
        grads(contextlib.nullcontext())
    got = grads(compat.compile_outside_dynamo())
    torch.manual_seed(0)
    x, w = torch.randn(4, 1024, requires_grad=True), torch.randn(4, 1025, requires_grad=True)
    Padded()(x, w)[0].backward()
    torch.testing.assert_close(got, [x.grad, w.grad])
