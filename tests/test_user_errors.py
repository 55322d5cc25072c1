"""A colauto ConfigError or BudgetError raised while torch.compile compiles reaches the caller as itself:
catchable as colauto_backend.ConfigError / BudgetError, one line, not wrapped in Dynamo's
BackendCompilerFailed nor followed by its "please report a bug" hints."""
import pickle
import traceback

import pytest
import torch
from torch._dynamo.exc import BackendCompilerFailed

import colauto_backend
from examples.models import build


def linear_step():
    model = torch.nn.Linear(8, 8)
    return model, torch.randn(4, 8)


def assert_one_line(err: BaseException, *needles: str) -> str:
    msg = str(err)
    assert "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, msg
    assert not isinstance(err, BackendCompilerFailed)
    shown = "".join(traceback.format_exception(err))
    for noise in ("BackendCompilerFailed", "please do this especially", "Set TORCHDYNAMO_VERBOSE", "During handling"):
        assert noise not in shown, shown
    assert shown.rstrip().splitlines()[-1] == f"{type(err).__module__}.{type(err).__qualname__}: {msg}"
    return msg


def test_bad_option_is_a_config_error_naming_the_key():
    model, x = linear_step()
    with pytest.raises(colauto_backend.ConfigError) as err:
        torch.compile(model, backend="colauto", options={"memory_budget": "lots"})(x)
    msg = assert_one_line(err.value, "options['memory_budget']='lots'", "is not valid")
    assert "COLAUTO_MEMORY_BUDGET" not in msg
    assert isinstance(err.value, ValueError)          # as before: ConfigError is a ValueError


def test_bad_environment_variable_is_a_config_error_naming_it(monkeypatch):
    monkeypatch.setenv("COLAUTO_MEMORY_BUDGET", "lots")
    model, x = linear_step()
    with pytest.raises(colauto_backend.ConfigError) as err:
        torch.compile(model, backend="colauto")(x)
    msg = assert_one_line(err.value, "COLAUTO_MEMORY_BUDGET='lots'", "is not valid")
    assert "options" not in msg


def test_unknown_option_key_is_a_config_error():
    model, x = linear_step()
    with pytest.raises(colauto_backend.ConfigError) as err:
        torch.compile(model, backend="colauto", options={"memory_budjet": "1GiB"})(x)
    assert_one_line(err.value, "options['memory_budjet'] is not a colauto option")


def test_infeasible_budget_is_a_budget_error():
    model, make = build("gpt2")
    inputs = make(4, 64)
    with pytest.raises(colauto_backend.BudgetError) as err:
        torch.compile(model, backend="colauto", options={"memory_budget": 1_000_000})(*inputs)
    assert_one_line(err.value, "COLAUTO_MEMORY_BUDGET", "smallest peak", "set it to at least")
    assert err.value.smallest_bytes > 1_000_000
    assert isinstance(err.value, RuntimeError)        # as before: BudgetError is a RuntimeError
    # the least budget it names works, in bytes and as the message writes it (rounded up: HF Qwen2 under
    # codegen inductor on CPU was told "at least 13.62 MiB", rounded to nearest, and refused 13.62 MiB)
    torch._dynamo.reset()
    torch.compile(model, backend="colauto", options={"memory_budget": err.value.smallest_bytes})(*inputs).backward()
    import re
    written = re.search(r"set it to at least ([0-9.]+) (\w+),", str(err.value))
    assert written, str(err.value)
    torch._dynamo.reset()
    torch.compile(model, backend="colauto", options={"memory_budget": written[1] + written[2]})(*inputs).backward()


def test_a_least_budget_is_written_rounded_up():
    """`report.fmt_bytes(n, up=True)`: never below the figure in the unit it is written in (the arithmetic)."""
    from colauto_backend.report import fmt_bytes
    units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    for n in (1, 1023, 1024, 1025, 14285000, 14285799, int(13.62 * 2**20) + 1, 5 * 2**30 + 1, 5 * 2**30):
        value, unit = fmt_bytes(n, up=True).split()
        assert float(value) * units[unit] >= n, (n, fmt_bytes(n, up=True))
        nearest, _ = fmt_bytes(n).split()
        assert round(float(value) - float(nearest), 2) in (0, 0.01) or unit == "B", (n, fmt_bytes(n, up=True), fmt_bytes(n))


def test_errors_survive_pickling():
    """A rank's error sent to another process (multiprocessing, torchrun's error files) keeps its fields."""
    err = colauto_backend.BudgetError("COLAUTO_MEMORY_BUDGET: too small", 1234)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is colauto_backend.BudgetError and str(back) == str(err) and back.smallest_bytes == 1234
    back = pickle.loads(pickle.dumps(colauto_backend.ConfigError("COLAUTO_MESH='x' is not valid")))
    assert str(back) == "COLAUTO_MESH='x' is not valid"


def test_other_backend_errors_are_still_wrapped():
    """Only colauto's own user errors pass through: a bug elsewhere keeps Dynamo's report."""
    def broken(gm, example_inputs):
        raise KeyError("boom")
    model, x = linear_step()
    with pytest.raises(BackendCompilerFailed):
        torch.compile(model, backend=broken)(x)
