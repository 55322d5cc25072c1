"""The one registry of what colauto did in this process: counts by event and reason, and the latest
results (analyses, parallel plans, sharded modules), for COLAUTO_REPORT, tests and the benchmarks.

Each module that counts gets its own named entry here once, at import, and keeps a short name for it
(`cuda_graphs.SKIPPED is counters.counter("cuda graphs skipped")`); `snapshot()` reads them all.

    from colauto_backend import counters
    counters.snapshot()["counts"]   # {"cuda graphs skipped": {...}, "compile cache hits": {...}, ...}
"""
from __future__ import annotations

import collections
from typing import Any

_COUNTS: dict[str, collections.Counter] = {}
_RECORDS: dict[str, collections.deque] = {}


def counter(name: str) -> collections.Counter:
    """The registry's Counter called `name` (made on first use): reason -> times."""
    return _COUNTS.setdefault(name, collections.Counter())


def records(name: str, maxlen: int | None = 16) -> collections.deque:
    """The registry's latest results called `name`, newest last (bounded where each holds a graph)."""
    return _RECORDS.setdefault(name, collections.deque(maxlen=maxlen))


def snapshot() -> dict[str, Any]:
    """Every count (as plain dicts) and how many results of each kind are held."""
    return {"counts": {name: dict(c) for name, c in _COUNTS.items()},
            "records": {name: len(r) for name, r in _RECORDS.items()}}
