"""Launch a script under torchrun on this machine (CPU, gloo ranks) for the multi-process tests.

`--standalone` lets torchrun pick a free port: tests running side by side (pytest -n) never share a
rendezvous. The caller's COLAUTO_* settings are not passed on, and the on-disk plan cache is off, as in
the test process (tests/conftest.py): every launch plans from scratch, whatever an earlier launch stored.
"""
import os
import re
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
    # PYTHONFAULTHANDLER: a rank killed by a signal prints every thread's Python stack
    run_env = clean_env() | {"PYTHONFAULTHANDLER": "1"} | (env or {})
    proc = subprocess.run(cmd, cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=timeout)
    crash = _native_crash(proc)
    if crash is None:
        return proc
    # A rank died in native code (once in CI: glibc's "malloc(): unaligned tcache chunk detected", SIGABRT,
    # not reproduced here since): the launch runs once more, and the crash, with the Python stacks the
    # faulthandler printed, is reported in the session's summary (conftest.py), never hidden; a second
    # crash fails the test.
    again = subprocess.run(cmd, cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=timeout)
    second = _native_crash(again)
    outcome = ("it passed on its second run" if again.returncode == 0
               else f"it failed again ({second or 'not by a signal'})")
    stacks = "\n".join(f"the crashed rank's Python stacks ({which} run):\n{fatal}"
                       for which, p in (("first", proc), ("second", again)) for fatal in [_fatal_stacks(p.stderr)] if fatal)
    RETRIED.append(f"{' '.join(args[:2])}: {crash}; {outcome}\n{stacks or proc.stderr[-4000:]}")
    return again


# Launches whose first run crashed in native code (torchrun): conftest.py prints them at the session's end.
RETRIED: list[str] = []


def _fatal_stacks(stderr: str, lines: int = 80) -> str:
    """What faulthandler printed for a rank killed by a signal ("Fatal Python error: Aborted" and every
    thread's Python stack), the first such block up to the next line of another writer (torch's log, a
    traceback, another rank's output), at most `lines` lines; "" if none."""
    start = stderr.find("Fatal Python error:")
    if start < 0:
        return ""
    block = []
    for line in stderr[start:].splitlines()[:lines]:
        if re.match(r"([WEI]\d{4} |Traceback|\[rank\d)", line):
            break
        block.append(line)
    return "\n".join(block).rstrip()


def _native_crash(proc: subprocess.CompletedProcess) -> str | None:
    """The first line naming a rank killed by a signal (SIGABRT, SIGSEGV), with glibc's message if any."""
    if proc.returncode == 0:
        return None
    signal = re.search(r"Signal (6|11|7) \(SIG\w+\) received by PID \d+", proc.stderr)
    if signal is None:
        return None
    glibc = re.search(r"^(malloc\(\)|free\(\)|double free|corrupted)[^\n]*", proc.stderr, re.M)
    return signal.group(0) + (f" after {glibc.group(0)!r}" if glibc else "")
