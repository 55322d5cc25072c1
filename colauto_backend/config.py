"""COLAUTO_* environment variables and `torch.compile(options=...)` -> one validated, frozen Config.

Every knob the backend reads lives here. A bad value raises `ConfigError` with one line that names
where it came from (the variable, or the `options=` key) and the accepted forms; nothing is silently
defaulted. Raised while torch.compile compiles, it reaches the caller as itself (not wrapped in Dynamo's
BackendCompilerFailed): see `_torch_compat.PassThroughError`.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Mapping

import torch

from ._torch_compat import PassThroughError

CODEGENS = ("auto", "aten", "inductor", "triton")
OPTIMIZERS = ("adamw", "adamw_foreach", "sgd", "none")


class ConfigError(PassThroughError, ValueError):
    """A COLAUTO_* setting or an `options=` key has a value the backend cannot use. One line; raised
    inside torch.compile it reaches the caller unwrapped, catchable as `colauto_backend.ConfigError`."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    codegen: str = "auto"            # how the partitioned graphs run: aten ops, Inductor, or colauto's Triton kernels;
                                     # auto: resolved per compiled graph by `resolve_codegen`
    device: str | None = None        # roofline preset name or JSON path; None = the device found
    report: str | None = None        # None = off, "1" = print table on rank 0, else a JSON path
    optimizer: str = "adamw"         # optimizer-state assumption of the memory model
    memory_budget: tuple[str, float] | None = None   # ("none"|"fraction"|"bytes", value); None = device memory
    mesh: tuple[tuple[str | None, int], ...] | None = None   # ((role or None, size), ...); None = planner picks
    comm: str | None = None          # interconnect preset or calibration JSON; None = the device's preset
    cudagraphs: bool = False         # replay the compiled graphs as CUDA graphs (every codegen)
    output_grads: str = "loss"       # loss: outputs returned beside a 0-dim loss get no gradient (output_grads.py);
                                     # all: every output's gradient is computed, zeros included
    planned_rules: frozenset[str] | None = None   # Inductor's heuristics that give way under a plan that
                                     # recomputes (compat._as_planned); empty: Inductor's own. None (auto): a
                                     # step held to the user's budget is compiled under `reuse` alone and
                                     # again under both if its compiled code's peak is over the budget
                                     # (backend._held_to_budget); any other planned step under both.
                                     # The fusion rule cost HF Qwen2 5% of its throughput on an H200
                                     # (bench/results/h200-2026-12-02-planned-rules) and took 3 of 4 CPU
                                     # points under their budgets
    # how a sharded plan without tp runs: graph (parallel/fsdp.py: gathers in the captured graph, the user's
    # Parameters hold their dim-0 rows); dtensor (parallel/emit.py: DTensor parameters, the module re-traced,
    # as tp plans run)
    fsdp: str = "graph"
    # on: under a budget the user set, a language model's loss gradient is computed in the forward, in
    # blocks of rows, so no [tokens, vocabulary] tensor is kept for the backward (chunked_loss.py). off by
    # default: on one H100 it ran GPT-2 124M and HF Qwen2 no faster at half their activation memory
    # (bench/results/h100-2026-12-07-chunked-loss)
    chunked_loss: str = "off"
    # bytes: the budget the user set, where the step is planned under less of it (backend._held_to_budget
    # keeps room for the memory model's error on the compiled code); the compiled peak is held to this one
    held_budget: int | None = None
    compiled_again_if_over: bool = False   # the compile's caller compiles once more if its peak is over the budget
    # bytes: under auto planned rules, a backward compiled with Inductor's horizontal fusions of recomputation
    # whose step peaks above this is compiled again refusing them (backend._codegen)
    fusion_rule_over: int | None = None


# name in options= -> (environment variable, parser)
# Each parser gets the raw text and the label to blame ("COLAUTO_CODEGEN='fast'" or "options['codegen']='fast'").
def _choice(choices: tuple[str, ...]):
    def parse(raw: str, label: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise ConfigError(f"{label} is not valid: use one of {', '.join(choices)}")
        return value
    return parse


def _report(raw: str, label: str) -> str | None:
    value = raw.strip()
    if value.lower() in ("", "0", "false", "off", "no"):
        return None
    if value.lower() in ("1", "true", "on", "yes"):
        return "1"
    if not value.endswith(".json"):
        raise ConfigError(
            f"{label} is not valid: use 1 (print the report), 0 (off) or a path ending in .json"
        )
    return value


def _device(raw: str, label: str) -> str:
    from .cost.device import PRESETS  # local import: device presets import config for errors

    value = raw.strip()
    if value.lower() in PRESETS:
        return value.lower()
    if value.endswith(".json") and os.path.isfile(value):
        return value
    raise ConfigError(
        f"{label} is not valid: use a preset ({', '.join(PRESETS)}) or the path of an existing .json file"
    )


_UNITS = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_BUDGET = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([a-z]*)\s*$", re.I)


def _budget(raw: str, label: str) -> tuple[str, float]:
    if raw.strip().lower() == "none":
        return ("none", 0.0)
    m = _BUDGET.match(raw)
    if m:
        value, unit = float(m.group(1)), m.group(2).lower()
        if not unit and 0 < value <= 1:
            return ("fraction", value)
        if unit in _UNITS and value > 0:
            return ("bytes", value * _UNITS[unit])
    raise ConfigError(f"{label} is not valid: use bytes with a unit (12GiB, 12000MB), "
                      "a fraction of the device's memory in (0, 1] (0.5), or none")


ROLES = ("dp", "fsdp", "tp")   # replicate + all-reduce grads; shard + gather at use; Megatron tensor parallel


def _mesh(raw: str, label: str) -> tuple[tuple[str | None, int], ...] | None:
    value = raw.strip().lower()
    if value in ("", "auto"):
        return None
    bad = ConfigError(f"{label} is not valid: use sizes (4, 2x2), named axes (dp=2,tp=2; roles "
                      f"{', '.join(ROLES)}) or auto; at most 3 axes")
    if "=" in value:
        axes = []
        for part in value.split(","):
            role, _, size = part.partition("=")
            if role.strip() not in ROLES or not size.strip().isdigit() or int(size) < 1:
                raise bad
            axes.append((role.strip(), int(size)))
        if len({r for r, _ in axes}) != len(axes):
            raise ConfigError(f"{label} names a role twice: give each of {', '.join(ROLES)} at most once")
    else:
        sizes = value.split("x")
        if not all(s.strip().isdigit() and int(s) >= 1 for s in sizes):
            raise bad
        axes = [(None, int(s)) for s in sizes]
    if len(axes) > 3:
        raise bad
    return tuple(axes)


def _cudagraphs(raw: str, label: str) -> bool:
    value = raw.strip().lower()
    if value not in ("0", "1", "false", "true"):
        raise ConfigError(f"{label} is not valid: use 1 (replay the graphs as CUDA graphs) or 0")
    return value in ("1", "true")


PLANNED_RULES = ("fusion", "reuse")


def _planned_rules(raw: str, label: str) -> frozenset[str] | None:
    value = raw.strip().lower()
    if value == "none":
        return frozenset()
    if value == "auto":
        return None
    rules = {part.strip() for part in value.split(",")}
    if not value or not rules <= set(PLANNED_RULES):
        raise ConfigError(f"{label} is not valid: use auto, a comma-separated list of {', '.join(PLANNED_RULES)}, "
                          "or none")
    return frozenset(rules)


def rules_of(config: Config) -> frozenset[str]:
    """The planned-graph rules a compile applies: the configured ones, or under auto both (a step held to
    the user's budget is compiled with concrete rules by backend._held_to_budget)."""
    return frozenset(PLANNED_RULES) if config.planned_rules is None else config.planned_rules


def _comm(raw: str, label: str) -> str:
    from .parallel.comm import PRESETS, resolve   # local import: comm imports config for errors
    value = raw.strip()
    if value not in PRESETS and not (value.endswith(".json") and os.path.isfile(value)):
        raise ConfigError(f"{label} is not valid: use a preset ({', '.join(PRESETS)}) or the JSON file "
                          "`python -m colauto_backend.calibrate` wrote")
    resolve(value, "")                         # reads the calibration file
    return value


_FIELDS = {
    "codegen": ("COLAUTO_CODEGEN", _choice(CODEGENS)),
    "device": ("COLAUTO_DEVICE", _device),
    "report": ("COLAUTO_REPORT", _report),
    "optimizer": ("COLAUTO_OPTIMIZER", _choice(OPTIMIZERS)),
    "memory_budget": ("COLAUTO_MEMORY_BUDGET", _budget),
    "mesh": ("COLAUTO_MESH", _mesh),
    "comm": ("COLAUTO_COMM", _comm),
    "cudagraphs": ("COLAUTO_CUDAGRAPHS", _cudagraphs),
    "output_grads": ("COLAUTO_OUTPUT_GRADS", _choice(("loss", "all"))),
    "planned_rules": ("COLAUTO_PLANNED_RULES", _planned_rules),
    "fsdp": ("COLAUTO_FSDP", _choice(("dtensor", "graph"))),
    "chunked_loss": ("COLAUTO_CHUNKED_LOSS", _choice(("on", "off"))),
}
# Read where they are used (triton_kernels, a package that does not depend on this one; plan_cache.py);
# validated here.
KERNEL_VARS = {"COLAUTO_CACHE_DIR": None, "COLAUTO_PRINT_KERNELS": ("0", "1"), "COLAUTO_AUTOTUNE": ("0", "1"),
               "COLAUTO_PLAN_CACHE": ("0", "1")}
ENV_VARS = tuple(var for var, _ in _FIELDS.values()) + tuple(KERNEL_VARS)


def load(options: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Read COLAUTO_* from the environment, then let `options` override (keys as in Config). An error
    names the `options` key when the value came from there, the variable otherwise."""
    environ = os.environ if environ is None else environ
    for var in environ:
        if var.startswith("COLAUTO_") and var not in ENV_VARS:
            raise ConfigError(f"{var} is not a colauto setting: the known variables are {', '.join(ENV_VARS)}")
        if KERNEL_VARS.get(var) and environ[var] not in KERNEL_VARS[var]:
            raise ConfigError(f"{var}={environ[var]!r} is not valid: use one of {', '.join(KERNEL_VARS[var])}")
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}           # key -> where its value came from, for errors across settings
    for key, (var, parse) in _FIELDS.items():
        if var in environ:
            origin[key] = f"{var}={environ[var]!r}"
            values[key] = parse(environ[var], origin[key])
    for key, raw in (options or {}).items():
        if key not in _FIELDS:
            raise ConfigError(f"options[{key!r}] is not a colauto option: use one of {', '.join(_FIELDS)}")
        if raw is None:          # not set here (planned_rules: auto, not the text "none")
            continue
        origin[key] = f"options[{key!r}]={raw!r}"
        text = str(raw)
        if key == "memory_budget" and isinstance(raw, (int, float)) and not isinstance(raw, bool) and raw > 1:
            text = f"{raw}b"                       # a plain number in options= is bytes
        values[key] = _FIELDS[key][1](text, origin[key])
    config = Config(**values)
    return config


def resolve_codegen(config: Config, example_inputs) -> Config:
    """`codegen="auto"` made concrete for the device the graph's inputs are on: on CUDA, Inductor's code
    generation, with or without CUDA graphs (the fastest path measured on HuggingFace models: colauto's
    own Triton kernels with CUDA graphs ran at 0.87-1.01x of it); elsewhere aten (op by op: nothing to
    compile)."""
    if config.codegen != "auto":
        return config
    import torch   # local import: this module is read before anything needs torch
    cuda = any(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in example_inputs)
    codegen = "inductor" if cuda else "aten"
    return dataclasses.replace(config, codegen=codegen)
