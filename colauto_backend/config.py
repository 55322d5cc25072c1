"""COLAUTO_* environment variables and `torch.compile(options=...)` -> one validated, frozen Config.

Every knob the backend reads lives here. A bad value raises `ConfigError` with one line that names
the variable and the accepted forms; nothing is silently defaulted.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

CODEGENS = ("aten", "inductor")
OPTIMIZERS = ("adamw", "adamw_foreach", "sgd", "none")


class ConfigError(ValueError):
    """A COLAUTO_* setting has a value the backend cannot use."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    codegen: str = "aten"            # how the partitioned graphs run: aten ops or Inductor's codegen
    device: str | None = None        # roofline preset name or JSON path; None = the device found
    report: str | None = None        # None = off, "1" = print table on rank 0, else a JSON path
    optimizer: str = "adamw"         # optimizer-state assumption of the memory model


# name in options= -> (environment variable, parser)
def _choice(var: str, choices: tuple[str, ...]):
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise ConfigError(f"{var}={raw!r} is not valid: use one of {', '.join(choices)}")
        return value
    return parse


def _report(raw: str) -> str | None:
    value = raw.strip()
    if value.lower() in ("", "0", "false", "off", "no"):
        return None
    if value.lower() in ("1", "true", "on", "yes"):
        return "1"
    if not value.endswith(".json"):
        raise ConfigError(
            f"COLAUTO_REPORT={raw!r} is not valid: use 1 (print the report), 0 (off) or a path ending in .json"
        )
    return value


def _device(raw: str) -> str:
    from .cost.device import PRESETS  # local import: device presets import config for errors

    value = raw.strip()
    if value.lower() in PRESETS:
        return value.lower()
    if value.endswith(".json") and os.path.isfile(value):
        return value
    raise ConfigError(
        f"COLAUTO_DEVICE={raw!r} is not valid: use a preset ({', '.join(PRESETS)}) or the path of an existing .json file"
    )


_FIELDS = {
    "codegen": ("COLAUTO_CODEGEN", _choice("COLAUTO_CODEGEN", CODEGENS)),
    "device": ("COLAUTO_DEVICE", _device),
    "report": ("COLAUTO_REPORT", _report),
    "optimizer": ("COLAUTO_OPTIMIZER", _choice("COLAUTO_OPTIMIZER", OPTIMIZERS)),
}
ENV_VARS = tuple(var for var, _ in _FIELDS.values())


def load(options: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Read COLAUTO_* from the environment, then let `options` override (keys as in Config)."""
    environ = os.environ if environ is None else environ
    for var in environ:
        if var.startswith("COLAUTO_") and var not in ENV_VARS:
            raise ConfigError(f"{var} is not a colauto setting: the known variables are {', '.join(ENV_VARS)}")
    values: dict[str, Any] = {}
    for key, (var, parse) in _FIELDS.items():
        if var in environ:
            values[key] = parse(environ[var])
    for key, raw in (options or {}).items():
        if key not in _FIELDS:
            raise ConfigError(f"options[{key!r}] is not a colauto option: use one of {', '.join(_FIELDS)}")
        values[key] = _FIELDS[key][1](str(raw))
    return Config(**values)

