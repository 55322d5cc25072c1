"""Progress lines on stderr for long one-shot commands (`python -m colauto_backend explain`): off unless
`start()` was called, so library use and compilation print nothing."""
from __future__ import annotations

import sys
import time

_start: float | None = None


def start(origin: float | None = None) -> None:
    """Print progress from now on, elapsed seconds counted from `origin` (a time.perf_counter(); now)."""
    global _start
    _start = time.perf_counter() if origin is None else origin


def stop() -> None:
    global _start
    _start = None


def say(message: str) -> None:
    """`colauto explain [  12.3 s] message` on stderr, when started."""
    if _start is not None:
        print(f"colauto explain [{time.perf_counter() - _start:7.1f} s] {message}", file=sys.stderr, flush=True)
