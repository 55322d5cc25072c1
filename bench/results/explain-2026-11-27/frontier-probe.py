"""Probe (not part of colauto): the remat DP's frontier for the explain run below, each point's bytes
freed as the memory grid states them (units x quantum) and exactly (the summed sizes of the tensors it
keeps, graph._kept_bytes), at the recompute times the 8B plans chose. Run with PYTHONPATH at a clean
export, from this directory:  python frontier-probe.py  (stderr: the PROBE lines, then explain's own)."""
import sys, runpy
import numpy as np
from colauto_backend import planner, graph

orig = planner.remat_frontier
kept_bytes = getattr(graph, "kept_bytes", None) or graph._kept_bytes   # named _kept_bytes before 0032ff4
TARGETS_MS = [0.2, 1.0, 2.77, 4.43, 4.80, 5.54, 10.34, 20.0]   # the recompute the fb90d38 and HEAD plans chose, and a few more


def hook(joint, baseline, base, buffers=frozenset()):
    fr, nodes, q = orig(joint, baseline, base, buffers)
    if getattr(hook, 'done', False):                  # explain may ask again for the same capture
        return fr, nodes, q
    hook.done = True
    mem, t = np.asarray(fr.memory), np.asarray(fr.time)
    exact = lambda k: sum(kept_bytes(n, baseline.hints) for n, kp in zip(nodes, fr.keep(k)) if kp)  # noqa: E731
    top = len(mem) - 1
    ex_top = exact(top)
    print(f"PROBE quantum {q / 2**20:.2f} MiB, {len(mem)} frontier points; keeping everything: "
          f"{mem[top] * q / 2**30:.2f} GiB by the grid, {ex_top / 2**30:.2f} GiB exactly", file=sys.stderr)
    for ms in TARGETS_MS:
        at_least = np.nonzero(t * 1e3 >= ms)[0]       # memory ascending, time descending
        if not len(at_least):
            continue
        k = int(at_least[-1])                          # the cheapest point costing at least `ms`
        print(f"PROBE point {k}: recompute {t[k] * 1e3:.2f} ms, frees {(mem[top] - mem[k]) * q / 2**30:.3f} GiB "
              f"by the grid, {(ex_top - exact(k)) / 2**30:.3f} GiB exactly", file=sys.stderr)
    return fr, nodes, q


planner.remat_frontier = hook
sys.argv = ["colauto_backend", "explain", "--model", "llama3-8b/config.json", "--batch", "1", "--seq", "8192",
            "--devices", "8", "--device", "h100"]
runpy.run_module("colauto_backend", run_name="__main__")
