"""Launch shapes timed on the GPU: for a region's first call with a new input signature on CUDA, plan
the launch under each candidate Tuning (tuning.*_CANDIDATES for its kernel family), time each with
the real inputs and keep the fastest. Generated kernels are pure (they write only the outputs each
call allocates), so running one several times is safe. Candidates never change the kernel's spec, so
they share one source; each distinct block/warp choice is one more Triton compile. The winner is kept
on disk beside the kernels (cache.tuned), keyed by the spec and the sizes, so a second process times
nothing. COLAUTO_AUTOTUNE=0 keeps the default Tuning.
"""
from __future__ import annotations

import hashlib
import os
from typing import Callable

from . import _triton, cache
from .launch import Launch
from .tuning import Tuning

STATS = {"timed": 0, "from_disk": 0}
TIMING = "gpu-time"     # how choices were timed (_triton.do_bench): choices timed otherwise are not reused


def enabled() -> bool:
    return os.environ.get("COLAUTO_AUTOTUNE", "1") == "1" and not _triton.interpreting()


def fastest(plan: Callable[[Tuning], Launch], kernel: Callable, candidates: tuple[Tuning, ...], tensors) -> Launch:
    """The launch, among plan(candidate) for each candidate, that runs these tensors fastest."""
    launches = {}
    for tuning in candidates:
        launch = plan(tuning)
        launches.setdefault(shape(launch), launch)
    first = next(iter(launches.values()))
    # sizes and strides are the launch's scalars; hashed, as a region with many inputs has hundreds
    key = hashlib.sha256(f"{cache.spec_key(first.spec)}-{first.scalars}-{TIMING}".encode()).hexdigest()[:32]
    best = cache.tuned(key)
    if best is not None and best in launches:
        STATS["from_disk"] += 1
    else:
        STATS["timed"] += 1
        bench = _triton.do_bench
        times = {}
        for name, launch in launches.items():
            launch.kernel = kernel
            times[name] = bench(lambda launch=launch: launch.run(tensors))
        best = min(times, key=times.get)
        cache.save_tuned(key, best)
    launch = launches[best]
    launch.kernel = kernel
    return launch


def shape(launch: Launch) -> str:
    """Block sizes, warps and grid (column sums: the same blocks split the rows over more or fewer programs)."""
    blocks = ",".join(f"{k}={v}" for k, v in sorted(launch.constexprs.items()))
    return f"{blocks},warps={launch.num_warps},grid={'x'.join(map(str, launch.grid))}"
