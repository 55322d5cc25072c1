"""The report (COLAUTO_REPORT's per-layer table) and Plan.recomputed name the compiled model's own layers,
whatever the compiled frame calls the module: HuggingFace models compiled directly and called with keywords
(their decorators' `wrapper(*args, **kwargs)` frame holds the model as args[0]), the project's zoo, and a
forward whose first argument is not named `self`. The reference is the model's `named_modules()`."""
import pytest
import torch

import colauto_backend
from colauto_backend import report
from colauto_backend.backend import ANALYSES
from examples.hf_zoo import build_hf
from examples.models import GPT2, build


def cut_after_index(name: str) -> str | None:
    """'model.layers.0.mlp.up_proj' -> 'model.layers.0' (None for a name with no index): the test's own
    rule for a repeated layer, applied to named_modules()."""
    parts = name.split(".")
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return None


def indexed_layers(model: torch.nn.Module) -> set[str]:
    return {cut for name, _ in model.named_modules() if (cut := cut_after_index(name))}


def reported_layers() -> set[str]:
    """Every module name of the report's per-layer rows, over every graph compiled in this test."""
    return {row["module"] for a in ANALYSES for row in report.summary(a)["layers"]} - {"(top level)", "(inputs)"}


def assert_named_as_model(model: torch.nn.Module, names: set[str]) -> None:
    modules = dict(model.named_modules())
    assert names, "no per-layer rows"
    assert names <= modules.keys(), sorted(names - modules.keys())


HF_SIDE = {"vit": 32}


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert", "t5", "vit"])
def test_hf_model_compiled_directly_reports_its_own_layers(name, monkeypatch, capsys):
    monkeypatch.setenv("COLAUTO_REPORT", "1")
    model, batch = build_hf(name)
    torch.compile(model, backend="colauto")(**batch(2, HF_SIDE.get(name, 16))).loss.backward()
    names = reported_layers()
    assert_named_as_model(model, names)
    assert indexed_layers(model) <= names, sorted(indexed_layers(model) - names)   # every layer has its row
    out = capsys.readouterr().out
    for layer in indexed_layers(model):
        assert f"\n{layer} " in out, layer          # the printed table's rows


@pytest.mark.parametrize("name", ["gpt2", "hf_llama"])
def test_zoo_model_reports_its_own_layers(name):
    model, make = build(name)
    torch.compile(model, backend="colauto")(*make(2, 16)).backward()
    names = reported_layers()
    assert_named_as_model(model, names)
    assert indexed_layers(model) <= names


def test_hf_plan_recomputed_names_the_layers():
    """Plan.recomputed is keyed by the model's layers, under a budget that forces recomputation."""
    model, batch = build_hf("llama")
    inputs = batch(4, 64)
    with pytest.raises(colauto_backend.BudgetError) as err:
        torch.compile(model, backend="colauto", options={"memory_budget": 1024})(**inputs)
    torch._dynamo.reset()
    ANALYSES.clear()
    compiled = torch.compile(model, backend="colauto", options={"memory_budget": err.value.smallest_bytes})
    compiled(**inputs).loss.backward()
    plan = max(ANALYSES, key=lambda a: len(a.costs.nodes)).plan
    assert plan.recomputed, "the smallest budget should recompute something"
    assert_named_as_model(model, set(plan.recomputed))
    assert set(plan.recomputed) & indexed_layers(model)


class GPT2NotSelf(GPT2):
    """The zoo's GPT-2 with a forward whose module argument is not called `self`."""

    def forward(s, idx, targets=None):  # noqa: N805 - the point of the test
        return GPT2.forward(s, idx, targets)


def gpt2_pair():
    model, make = build("gpt2")
    other = GPT2NotSelf(model.cfg)
    other.load_state_dict(model.state_dict())
    return model, other, make


def test_forward_not_named_self_trains_as_eager_and_reports_its_layers():
    model, other, make = gpt2_pair()
    inputs = make(3, 12)
    ref = model(*inputs)
    ref.backward()
    loss = torch.compile(other, backend="colauto")(*inputs)
    loss.backward()
    torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-5)
    grads = dict(model.named_parameters())
    for n, p in other.named_parameters():
        torch.testing.assert_close(p.grad, grads[n].grad, atol=1e-5, rtol=1e-4, msg=n)
    names = reported_layers()
    assert_named_as_model(other, names)
    assert indexed_layers(other) <= names


def test_forward_not_named_self_gets_the_same_parallel_plan():
    """The distributed planner reads module paths (tensor-parallel pairs, per-layer choices) from the
    same Dynamo names: a module called `s` in its forward must plan as when it is called `self`."""
    model, other, make = gpt2_pair()
    inputs = make(2, 16)
    plans = []
    for m in (model, other):
        torch._dynamo.reset()
        plans.append(colauto_backend.explain(m, *inputs, mesh="4", device="h100", budget="none").to_json())
    ref, got = plans
    assert got["mesh"] == ref["mesh"] and got["tp_modules"] == ref["tp_modules"]
    assert got["predicted"]["tp_off_layers"] == ref["predicted"]["tp_off_layers"]
    assert got["predicted"]["step_time_s"] == pytest.approx(ref["predicted"]["step_time_s"])
    modules = dict(other.named_modules())
    assert set(got["tp_modules"] or {}) <= modules.keys()
    assert set(got["predicted"]["tp_off_layers"]) <= modules.keys()


class TensorAttribute(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.scale = torch.ones(8)          # neither a parameter nor a buffer

    def forward(s, x):  # noqa: N805
        return (s.fc(x) * s.scale).sum()


def test_plan_names_parameters_of_a_module_not_named_self():
    """The parallel plan names parameters from Dynamo's sources whatever the forward calls its module
    (`s` here); a plain tensor attribute is neither placed nor refused (the model's ops see it as it is:
    plain under dp and fsdp, replicated under tp)."""
    plan = colauto_backend.explain(TensorAttribute(), torch.randn(4, 8), mesh="2", device="h100")
    assert set(plan.storage) == {"fc.weight", "fc.bias"}
