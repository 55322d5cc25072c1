"""COLAUTO_* settings: bad values fail with one line naming the variable and the accepted forms."""
import pytest
import torch

from colauto_backend import config as cfg
from colauto_backend._torch_compat import unwrap_backend_error
from examples.models import build


@pytest.mark.parametrize("var, value, accepted", [
    ("COLAUTO_CODEGEN", "triton2", "aten, inductor"),
    ("COLAUTO_DEVICE", "h900", "h100"),
    ("COLAUTO_REPORT", "maybe", ".json"),
    ("COLAUTO_OPTIMIZER", "adam", "adamw"),
    ("COLAUTO_MESHH", "2x2", "COLAUTO_CODEGEN"),
    ("COLAUTO_CUDAGRAPHS", "yes", "use 1"),
])
def test_bad_value_is_one_line_naming_variable(var, value, accepted):
    with pytest.raises(cfg.ConfigError) as err:
        cfg.load(environ={var: value})
    msg = str(err.value)
    assert "\n" not in msg and var in msg and accepted in msg


def test_cuda_graphs_setting():
    assert cfg.load(environ={"COLAUTO_CUDAGRAPHS": "1"}).cudagraphs
    assert not cfg.load({"cudagraphs": False}, environ={"COLAUTO_CUDAGRAPHS": "1"}).cudagraphs
    assert not cfg.load(environ={}).cudagraphs
    with pytest.raises(cfg.ConfigError, match="reduce-overhead"):     # Inductor has its own
        cfg.load({"cudagraphs": True, "codegen": "inductor"}, environ={})


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
    with pytest.raises(Exception) as err:
        torch.compile(model, backend="colauto")(*make(2, 8))
    inner = unwrap_backend_error(err.value)
    assert isinstance(inner, cfg.ConfigError) and "COLAUTO_CODEGEN='fast'" in str(inner)
