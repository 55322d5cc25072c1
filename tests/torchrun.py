"""Launch a script under torchrun on this machine (CPU, gloo ranks) for the multi-process tests.

`--standalone` lets torchrun pick a free port: tests running side by side (pytest -n) never share a
rendezvous. The caller's COLAUTO_* settings are not passed on.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def torchrun(nproc: int, args: list[str], *, timeout: int, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python -m torch.distributed.run --standalone --nproc-per-node NPROC ARGS...` in the repository root;
    `args` is a script path or `-m module`, then its arguments."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("COLAUTO_")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *args]
    return subprocess.run(cmd, cwd=ROOT, env=base | (env or {}), capture_output=True, text=True, timeout=timeout)
