"""Launch a script under torchrun on this machine (CPU, gloo ranks) for the multi-process tests.

`--standalone` lets torchrun pick a free port: tests running side by side (pytest -n) never share a
rendezvous. The caller's COLAUTO_* settings are not passed on, and the on-disk plan cache is off, as in
the test process (tests/conftest.py): every launch plans from scratch, whatever an earlier launch stored.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def clean_env() -> dict:
    """The environment for a test's subprocess: no COLAUTO_* from the caller, the plan cache off."""
    return {k: v for k, v in os.environ.items() if not k.startswith("COLAUTO_")} | {"COLAUTO_PLAN_CACHE": "0"}


def torchrun(nproc: int, args: list[str], *, timeout: int, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python -m torch.distributed.run --standalone --nproc-per-node NPROC ARGS...` in the repository root;
    `args` is a script path or `-m module`, then its arguments; `env` adds to (or overrides) clean_env()."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *args]
    return subprocess.run(cmd, cwd=ROOT, env=clean_env() | (env or {}), capture_output=True, text=True,
                          timeout=timeout)
