"""COLAUTO_* settings: bad values fail with one line naming the variable and the accepted forms."""
import pytest
import torch

import colauto_backend
from colauto_backend import config as cfg
from examples.models import build


@pytest.mark.parametrize("var, value, accepted", [
    ("COLAUTO_CODEGEN", "triton2", "aten, inductor"),
    ("COLAUTO_DEVICE", "h900", "h100"),
    ("COLAUTO_REPORT", "maybe", ".json"),
    ("COLAUTO_OPTIMIZER", "adam", "adamw"),
    ("COLAUTO_MESHH", "2x2", "COLAUTO_CODEGEN"),
    ("COLAUTO_CUDAGRAPHS", "yes", "use 1"),
    ("COLAUTO_PLANNED_RULES", "fuse", "fusion, reuse, or none"),
    ("COLAUTO_FSDP", "zero3", "dtensor, graph"),
    ("COLAUTO_CHUNKED_LOSS", "auto", "on, off"),
])
def test_bad_value_is_one_line_naming_variable(var, value, accepted):
    with pytest.raises(cfg.ConfigError) as err:
        cfg.load(environ={var: value})
    msg = str(err.value)
    assert "\n" not in msg and var in msg and accepted in msg


@pytest.mark.parametrize("key, value, accepted", [
    ("codegen", "triton2", "aten, inductor"),
    ("device", "h900", "h100"),
    ("report", "maybe", ".json"),
    ("optimizer", "adam", "adamw"),
    ("memory_budget", "lots", "12GiB"),
    ("memory_budget", -5, "12GiB"),
    ("mesh", "2y2", "dp=2,tp=2"),
    ("mesh", "dp=2,dp=2", "names a role twice"),
    ("comm", "infiniband", "nvlink-h100"),
    ("cudagraphs", "yes", "use 1"),
    ("planned_rules", "fusion,", "use auto, a comma-separated list of fusion, reuse, or none"),
    ("fsdp", "simple", "dtensor, graph"),
    ("chunked_loss", "yes", "on, off"),
])
def test_bad_option_is_one_line_naming_the_key(key, value, accepted):
    """An options= value is blamed on its key (with the value as given), not on the variable."""
    with pytest.raises(cfg.ConfigError) as err:
        cfg.load({key: value}, environ={})
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"options[{key!r}]={value!r} ") and accepted in msg, msg
    assert "COLAUTO_" not in msg.split(" is not valid")[0].split(" names")[0]


def test_bad_value_from_the_environment_is_blamed_on_the_variable():
    with pytest.raises(cfg.ConfigError) as err:
        cfg.load({"codegen": "aten"}, environ={"COLAUTO_MESH": "2y2"})
    assert str(err.value).startswith("COLAUTO_MESH='2y2' is not valid")


def test_cuda_graphs_setting():
    assert cfg.load(environ={"COLAUTO_CUDAGRAPHS": "1"}).cudagraphs
    assert not cfg.load({"cudagraphs": False}, environ={"COLAUTO_CUDAGRAPHS": "1"}).cudagraphs
    assert not cfg.load(environ={}).cudagraphs
    # every codegen replays as CUDA graphs: Inductor's code as under mode="reduce-overhead"
    assert cfg.load({"cudagraphs": True}, environ={"COLAUTO_CODEGEN": "inductor"}).cudagraphs


def test_planned_rules_setting():
    assert cfg.load(environ={}).planned_rules is None                # auto (backend._held_to_budget)
    assert cfg.rules_of(cfg.load(environ={})) == {"fusion", "reuse"}  # unheld planned steps: both
    assert cfg.load(environ={"COLAUTO_PLANNED_RULES": "Auto"}).planned_rules is None
    assert cfg.load(environ={"COLAUTO_PLANNED_RULES": "none"}).planned_rules == frozenset()
    assert cfg.load({"planned_rules": " Reuse "}, environ={}).planned_rules == {"reuse"}


def test_bad_option_key():
    with pytest.raises(cfg.ConfigError, match="options\\['codgen'\\]"):
        cfg.load({"codgen": "aten"}, environ={})


def test_options_override_environment():
    config = cfg.load({"codegen": "inductor"}, environ={"COLAUTO_CODEGEN": "aten", "COLAUTO_REPORT": "1"})
    assert config.codegen == "inductor" and config.report == "1"


def test_device_json_file(tmp_path):
    import dataclasses, json
    from colauto_backend.cost.device import PRESETS, resolve
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(dataclasses.asdict(dataclasses.replace(PRESETS["h100"], name="mine", bandwidth=1e12))))
    spec = resolve(cfg.load(environ={"COLAUTO_DEVICE": str(path)}).device)
    assert spec.name == "mine" and spec.bandwidth == 1e12


def test_bad_env_fails_compilation_loudly(monkeypatch):
    monkeypatch.setenv("COLAUTO_CODEGEN", "fast")
    model, make = build("gpt2")
    with pytest.raises(colauto_backend.ConfigError) as err:     # itself, not wrapped by Dynamo
        torch.compile(model, backend="colauto")(*make(2, 8))
    assert str(err.value).startswith("COLAUTO_CODEGEN='fast' is not valid") and "\n" not in str(err.value)


def test_codegen_auto_is_chosen_by_the_inputs_device(capsys):
    """No codegen set: Inductor's code generation on CUDA (also when CUDA graphs are asked for: colauto's
    Triton kernels ran slower there on HF models), aten elsewhere; an explicit codegen is kept; the report says which ran."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from colauto_backend.config import load, resolve_codegen
    with FakeTensorMode():
        gpu = [torch.empty(2, device="cuda")]
    cpu = [torch.empty(2)]
    assert load({}).codegen == "auto"
    assert resolve_codegen(load({}), gpu).codegen == "inductor"
    assert resolve_codegen(load({"cudagraphs": True}), gpu).codegen == "inductor"
    assert resolve_codegen(load({}), cpu).codegen == "aten"
    assert resolve_codegen(load({"codegen": "triton"}), cpu).codegen == "triton"
    assert resolve_codegen(load({"codegen": "aten"}), gpu).codegen == "aten"

    lin = torch.nn.Linear(4, 4)
    torch.compile(lin, backend="colauto", options={"report": "1"})(torch.randn(2, 4)).sum().backward()
    assert "colauto cost model  (codegen aten (auto)," in capsys.readouterr().out


def test_graph_fsdp_takes_dim_0_shards_over_one_fsdp_axis_and_names_what_it_leaves():
    """COLAUTO_FSDP=graph (parallel/fsdp.py, the default): the parameters an fsdp, dp x fsdp or fsdp x
    (unused) tp plan cuts on dim 0 over fsdp are found; a plan it cannot run (a shard on dim 1, a shard over
    another axis) is named in words (the entry counts it and runs the DTensor path instead)."""
    from colauto_backend.parallel import fsdp
    from colauto_backend.parallel.plan import ParallelPlan
    w, b = torch.nn.Parameter(torch.zeros(4, 3)), torch.nn.Parameter(torch.zeros(4))
    names = {0: "w", 2: "b"}
    inputs = [w, torch.zeros(2), b]
    for plan in [ParallelPlan((("fsdp", 2),), {"w": ("S0",), "b": ("R",)}, {}),
                 ParallelPlan((("dp", 2), ("fsdp", 2)), {"w": ("R", "S0"), "b": ("R", "R")}, {}),
                 ParallelPlan((("fsdp", 2), ("tp", 2)), {"w": ("S0", "R"), "b": ("R", "R")}, {})]:
        assert fsdp.unsupported(plan, names, inputs) is None, plan
        assert fsdp.shards(plan, names, inputs) == ([0], True)
    assert fsdp.shards(ParallelPlan((("fsdp", 2),), {"w": ("R",), "b": ("R",)}, {}), names, inputs) == ([], False)
    assert fsdp.rows(5, 0, 2) == (0, 3) and fsdp.rows(5, 1, 2) == (3, 2) and fsdp.rows(1, 1, 2) == (1, 0)
    for bad, words in [(ParallelPlan((("fsdp", 2),), {"w": ("S1",)}, {}), "as S1 on fsdp=2, not on dim 0 over fsdp alone"),
                       (ParallelPlan((("dp", 2), ("fsdp", 2)), {"w": ("S0", "S0")}, {}), "as S0/S0 on dp=2,fsdp=2"),
                       (ParallelPlan((("tp", 2),), {"w": ("S0",)}, {}), "mesh tp=2 shards parameters without one fsdp axis")]:
        assert words in fsdp.unsupported(bad, names, inputs), (bad, fsdp.unsupported(bad, names, inputs))


def test_graph_fsdp_is_the_default_and_a_bad_value_is_one_line():
    assert cfg.load(environ={}).fsdp == "graph"
    assert cfg.load(environ={"COLAUTO_FSDP": "dtensor"}).fsdp == "dtensor"
    with pytest.raises(cfg.ConfigError) as err:
        cfg.load(environ={"COLAUTO_FSDP": "ddp"})
    assert str(err.value) == "COLAUTO_FSDP='ddp' is not valid: use one of dtensor, graph", err.value


@pytest.mark.parametrize("together", [False, True])
def test_a_parameter_cut_in_place_is_guarded_by_identity_alone(together):
    """The guards Dynamo holds on a parameter's source (its size check above all: a cut parameter's shape
    changes), and on sources reached through it (its .grad), give way to one identity check; the other
    parameter's and the module's guards stay. With torch 2.11's `is_from_source`, which never matches a
    chained source itself (only its bases), torch's `remove_guards_with_source` left the size check and the
    cut failed in Dynamo ("Guard failed on the same frame it was created"): the adapter walks the sources
    itself, for all the graph's parameters in one pass (`together`: both parameters at once)."""
    import types
    import torch._dynamo.source as dsource
    from torch._dynamo.guards import GuardBuilder
    from torch._guards import Guard, TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
    from colauto_backend import _torch_compat as compat
    root = dsource.LocalSource("self")
    param = dsource.DictGetItemSource(dsource.AttrSource(root, "_parameters"), "weight")
    other = dsource.DictGetItemSource(dsource.AttrSource(root, "_parameters"), "bias")
    ctx = TracingContext(FakeTensorMode())
    with tracing(ctx):
        guards = ctx.guards_context.dynamo_guards
        for source in (param, other):
            guards.add(Guard(source, GuardBuilder.TENSOR_MATCH))
        guards.add(Guard(dsource.AttrSource(param, "grad"), GuardBuilder.TENSOR_MATCH))
        guards.add(Guard(root, GuardBuilder.TYPE_MATCH))
        cut = [param, other] if together else [param]
        compat.guard_parameters_by_identity([types.SimpleNamespace(meta={"grapharg": types.SimpleNamespace(source=s)})
                                             for s in cut])
        left = sorted((g.name, g.create_fn_name()) for g in guards)
        if hasattr(guards, "source_to_guards"):   # torch's own index agrees with the set
            assert sorted((g.name, g.create_fn_name()) for gs in guards.source_to_guards.values() for g in gs) == left
    want = [(param.name, "ID_MATCH"), (root.name, "TYPE_MATCH"),
            (other.name, "ID_MATCH" if together else "TENSOR_MATCH")]
    assert left == sorted(want), left