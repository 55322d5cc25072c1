"""A pytest plugin (tests/conftest.py imports its hooks): every test dependency must be installed.

README's install command (pip install -e ".[test]") installs what the tests import. A test module that
skips itself at import (pytest.importorskip("triton"), a module-level pytest.skip) would hide all its
tests behind one "s" in the summary: here it is a collection error. A test skipped by an importorskip
inside it fails. A session in which no test ran (all skipped) fails. Per-test skips for hardware the host
lacks (skipif no CUDA) are untouched; `--allow-missing-deps` turns all of this off (a bare host).
No torch here: tests/test_strict_deps.py runs it in pytest subprocesses.
"""
import pytest

INSTALL_HINT = 'install the test dependencies (pip install -e ".[test]"), or pass --allow-missing-deps to skip'


def pytest_addoption(parser):
    parser.addoption("--allow-missing-deps", action="store_true", default=False,
                     help="let test modules (and tests) whose dependency is not installed skip instead of failing")


def _skip_reason(longrepr) -> str:
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    report = (yield).get_result()
    if (report.skipped and isinstance(collector, pytest.Module)
            and not collector.config.getoption("allow_missing_deps")):
        report.outcome = "failed"
        report.longrepr = (f"{collector.nodeid} skipped itself at import ({_skip_reason(report.longrepr)}): "
                           f"its tests would not run; {INSTALL_HINT}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    excinfo = call.excinfo
    if (report.skipped and excinfo is not None and not item.config.getoption("allow_missing_deps")
            and any(entry.name == "importorskip" for entry in excinfo.traceback)):
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid}: a test dependency is missing ({excinfo.value}); {INSTALL_HINT}"


_RAN: list[str] = []


def pytest_runtest_logreport(report):
    if report.when == "call" and not report.skipped:
        _RAN.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    """A session in which no test ran (everything skipped) fails: it checked nothing."""
    if (exitstatus == pytest.ExitCode.OK and session.testscollected and not _RAN
            and not session.config.getoption("collectonly")):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"colauto: none of the {session.testscollected} collected tests ran "
                                f"(all skipped); {INSTALL_HINT}", red=True)
