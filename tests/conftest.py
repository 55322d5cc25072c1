import json
import os
import sys

# Inductor's CPU kernels are compiled as scalar C++ (no SIMD intrinsics): the same kernels, about half
# the g++ time, which is most of a codegen=inductor test on CPU. Set before torch is imported, so the
# torchrun ranks and subprocesses the tests start inherit it. (GPU hosts: no effect on Triton kernels.)
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")

import pytest  # noqa: E402
import torch  # noqa: E402

if not torch.cuda.is_available():
    # generated Triton kernels run in Triton's interpreter here; it must be on before anything imports triton
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # examples/, bench/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))                   # strict_deps

import colauto_backend  # noqa: E402  (after TRITON_INTERPRET)

if os.environ.get("PYTEST_XDIST_WORKER") and not torch.cuda.is_available():
    # `-n N` (pytest-xdist) runs N processes, one a core: each keeps to one intra-op thread
    torch.set_num_threads(1)

# Without `pip install -e .` (a bare GPU host) the torch_dynamo_backends entry point is missing: register
# the same function by hand so backend="colauto" resolves. Where installed (CI), the entry point is used.
if "colauto" not in torch._dynamo.list_backends(exclude_tags=()):
    torch._dynamo.register_backend(colauto_backend.colauto, name="colauto")


# Every test dependency must be installed: a test module that skips itself for a missing one is a collection
# error, a test skipped by importorskip fails, and a session where no test ran fails (tests/strict_deps.py;
# `--allow-missing-deps` skips instead).
from strict_deps import (pytest_addoption, pytest_make_collect_report, pytest_runtest_logreport,  # noqa: E402,F401
                         pytest_runtest_makereport, pytest_sessionfinish)


# Longest first: under `-n` a long test left for last runs alone on one core while the other idles.
# tests/durations.json holds each test's seconds from a full run (`python tests/durations.py JUNIT_XML`
# rewrites it); a test it does not list (new, or under 3 s) counts as 1 s. Only the order depends on it.
DURATIONS = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")))


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: -DURATIONS.get(item.nodeid, 1.0))   # stable: file order among equals


@pytest.fixture(autouse=True)
def report_retried_launches(request):
    """A torchrun launch rerun after a native crash (tests/torchrun.py) is attached to its test's report,
    so the session's summary names it, under pytest-xdist too."""
    import torchrun
    seen = len(torchrun.RETRIED)
    yield
    for entry in torchrun.RETRIED[seen:]:
        request.node.user_properties.append((RETRIED_KEY, entry))


RETRIED_KEY = "torchrun launch rerun after a native crash"


def pytest_terminal_summary(terminalreporter):
    entries = {(report.nodeid, value) for reports in terminalreporter.stats.values() for report in reports
               for key, value in getattr(report, "user_properties", ()) if key == RETRIED_KEY}
    if entries:
        terminalreporter.section(f"{len(entries)} torchrun launch(es) crashed in native code and were rerun")
        for nodeid, value in sorted(entries):
            terminalreporter.write_line(f"{nodeid}: {value}")


@pytest.fixture(scope="module")
def group():
    """A one-rank gloo process group (its name), for collectives checked in-process: an all-reduce of one
    rank is the identity, so a rewritten graph must give eager's values exactly."""
    import torch.distributed as dist
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield dist.group.WORLD.group_name
    if started:   # left running, it made a later module in the same worker skip (tests/test_dtensor_rules.py)
        dist.destroy_process_group()


@pytest.fixture(autouse=True)
def fresh_dynamo(monkeypatch):
    """Each test compiles from scratch and sees no COLAUTO_* from the caller's shell. The on-disk plan
    cache is off (a plan stored by another test or run would replace the planning under test);
    tests/test_remat.py turns it on where it is the subject."""
    for var in [v for v in os.environ if v.startswith("COLAUTO_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("COLAUTO_PLAN_CACHE", "0")
    torch._dynamo.reset()
    torch.manual_seed(0)
    from colauto_backend.backend import ANALYSES
    ANALYSES.clear()    # bounded history: counts in tests start from empty
    # as in a new process: no graph break recorded (a budgeted compile after one is a split step's graph,
    # colauto_backend/split_step.py), and no forward run by an earlier test still counted as pending
    torch._dynamo.utils.counters.pop("graph_break", None)
    torch._dynamo.utils.counters.pop("unimplemented", None)
    from colauto_backend import report, split_step
    split_step.reset()
    # ... and no break named yet (report names each once per process: an earlier test's break of the same
    # model left the line a test asserts unprinted, in CI's order at e6ee746)
    monkeypatch.setattr(report, "_BREAKS_SEEN", set())
    monkeypatch.setattr(report, "_BUDGET_BREAKS_SEEN", set())
    yield
    torch._dynamo.reset()


@pytest.fixture
def fused_graphs(monkeypatch):
    """Every graph that COLAUTO_CODEGEN=triton fuses, as (graph module after fusion, fusion.Fusion)."""
    from colauto_backend import fusion
    seen = []
    real = fusion.fuse

    def spy(gm, **kwargs):
        done = real(gm, **kwargs)
        seen.append((gm, done))
        return done
    monkeypatch.setattr(fusion, "fuse", spy)
    return seen
