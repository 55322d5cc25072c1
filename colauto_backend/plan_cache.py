"""The on-disk plan cache: a second launch of the same script plans nothing.

A rematerialization plan is the set of forward nodes kept for backward, by node name. It is stored
under COLAUTO_CACHE_DIR/plans (default ~/.cache/colauto/plans) in a file named by a hash of everything
the choice depends on: the joint graph's code, its inputs' shapes and dtypes, the example sizes, the
budget, the codegen, the device and optimizer models, and the versions of torch and of this format.
On a hit the planner tags the joint graph with the stored decisions and partitions it once, with no
DP and no candidate; the plan is used only if its simulated peak still fits the budget (otherwise it is
planned anew, and Plan.cache says "stale"). COLAUTO_PLAN_CACHE=0 turns the cache off.

With Inductor's code generation the whole compiled step is cached too, by torch's AOTAutograd cache
(in Inductor's cache directory, TORCHINDUCTOR_CACHE_DIR): its key holds `compile_key()`, a hash of
colauto's own source and the settings the plan depends on. A second launch of the same graph then
skips the joint-graph trace, the partition and the plan, as a warm plain torch.compile does.
COLAUTO_PLAN_CACHE=0 turns this off as well.
Where Inductor generates a training step's code under a budget the user set, the peak of the compiled
code is checked against the budget at compile time (backend.py, `_held_to_budget`); a step found over it
is planned again with the model's error on it taken off the budget, and that margin is kept here too (plans/margins,
keyed by the captured graph and the settings), so that later launches plan under it at once.
Files are written whole (a temporary file renamed over the target), so ranks of one job that write
the same plan at once leave one valid file.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

FORMAT = 2        # bump when what a file holds, or what the planner does with it, changes


def directory() -> Path | None:
    """Where plans are kept; None when COLAUTO_PLAN_CACHE=0."""
    if os.environ.get("COLAUTO_PLAN_CACHE", "1") == "0":
        return None
    base = os.environ.get("COLAUTO_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "colauto") / "plans"


def key(joint: fx.GraphModule, settings: tuple) -> str:
    """A hash of the joint graph (its code and its inputs' shapes and dtypes) and `settings` (repr'd)."""
    inputs = []
    for n in joint.graph.nodes:
        if n.op == "placeholder":
            val = n.meta.get("val")
            inputs.append((n.name, str(tuple(val.shape)), str(val.dtype)) if isinstance(val, torch.Tensor)
                          else (n.name, repr(val)))
    text = repr((FORMAT, torch.__version__, joint.code, inputs, settings))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@functools.cache
def source_digest() -> str:
    """A hash of colauto's source files, read once per process."""
    digest = hashlib.sha256()
    root = Path(__file__).parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def compile_key(settings: tuple) -> str:
    """A hash of colauto's source (any change to the planner invalidates what was compiled under it)
    and `settings` (repr'd)."""
    return hashlib.sha256(repr((FORMAT, source_digest(), settings)).encode()).hexdigest()[:32]


def margin_key(gm: fx.GraphModule, example_inputs: list, settings: tuple) -> str:
    """A hash of a captured (Dynamo) graph's code, its inputs' shapes and dtypes, colauto's source and
    `settings` (repr'd): the key of the budget margin kept for it (`load_margin`)."""
    inputs = [(tuple(t.shape), str(t.dtype)) if isinstance(t, torch.Tensor) else repr(t) for t in example_inputs]
    text = repr((FORMAT, torch.__version__, source_digest(), gm.code, inputs, settings))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclasses.dataclass(frozen=True)
class KeptMargin:
    """What an earlier launch learned about holding one step to its budget (`backend._held_to_budget`)."""
    nbytes: int = 0                          # plan under the budget less this (negative: more than the budget)
    rules: frozenset[str] | None = None      # the planned-graph rules the step had to be compiled under
    settled: bool = False                    # the search for a looser plan ran: a later launch does not redo it


def load_margin(digest: str) -> KeptMargin:
    """The margin kept for a step (`KeptMargin()`: none kept, or a file that does not parse)."""
    kept = load(f"margins/{digest}") or {}
    rules = kept.get("rules")
    return KeptMargin(int(kept["bytes"]) if isinstance(kept.get("bytes"), int) else 0,
                      frozenset(rules) if isinstance(rules, list) and all(isinstance(r, str) for r in rules) else None,
                      kept.get("settled") is True)


def store_margin(digest: str, nbytes: int, rules: frozenset[str] | None = None, settled: bool = False) -> str | None:
    """Keep the margin (and the rules the step needed, if given; `settled`: see KeptMargin); None, or why
    it could not be kept."""
    return store(f"margins/{digest}", {"bytes": int(nbytes)} | ({"rules": sorted(rules)} if rules is not None else {})
                 | ({"settled": True} if settled else {}))


def load(digest: str) -> dict[str, Any] | None:
    """The stored plan, or None (no cache, no file, or a file that does not parse)."""
    where = directory()
    if where is None:
        return None
    try:
        with open(where / f"{digest}.json") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def store(digest: str, plan: dict[str, Any]) -> str | None:
    """Write the plan; None, or why it could not be written (Plan.cache reports it; the plan is used)."""
    where = directory()
    if where is None:
        return "COLAUTO_PLAN_CACHE=0"
    try:
        (where / digest).parent.mkdir(parents=True, exist_ok=True)   # a digest may name a subfolder (margins/)
        fd, tmp = tempfile.mkstemp(dir=where, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(plan, f)
        os.replace(tmp, where / f"{digest}.json")
    except OSError as error:
        return f"{type(error).__name__}: {error}"
    return None
