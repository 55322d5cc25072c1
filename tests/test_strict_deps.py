"""tests/strict_deps.py (hooks of tests/conftest.py): a test module or test that skips for a missing
dependency is an error, and a session in which no test ran fails (each case is a pytest subprocess with
that plugin and no other)."""
import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def run_pytest(tmp_path, source: str, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_case.py").write_text(textwrap.dedent(source))
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "strict_deps", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), str(tmp_path / "test_case.py"), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


MISSING_AT_IMPORT = """
    import pytest
    pytest.importorskip("colauto_no_such_dependency", reason="not importable: nothing to test")

    def test_never_runs():
        pass
"""

MISSING_IN_TEST = """
    import pytest

    def test_ok():
        pass

    def test_needs_it():
        pytest.importorskip("colauto_no_such_dependency")

    @pytest.mark.skipif(True, reason="hardware this host lacks")
    def test_hardware():
        pass
"""

NOTHING_RUNS = """
    import pytest

    @pytest.mark.skip(reason="never")
    def test_skipped():
        pass
"""


def test_module_skipped_for_a_missing_dependency_is_an_error(tmp_path):
    done = run_pytest(tmp_path, MISSING_AT_IMPORT)
    assert done.returncode not in (0, 5), done.stdout
    assert "skipped itself at import (not importable: nothing to test)" in done.stdout, done.stdout
    assert 'pip install -e ".[test]"' in done.stdout
    allowed = run_pytest(tmp_path, MISSING_AT_IMPORT, "--allow-missing-deps")
    assert allowed.returncode == 5 and "1 skipped" in allowed.stdout, allowed.stdout   # pytest: no test ran


def test_test_skipped_by_importorskip_fails_but_a_hardware_skip_does_not(tmp_path):
    done = run_pytest(tmp_path, MISSING_IN_TEST, "-rA")
    assert done.returncode == 1, done.stdout
    assert "1 failed, 1 passed, 1 skipped" in done.stdout, done.stdout
    assert "FAILED test_case.py::test_needs_it" in done.stdout
    assert run_pytest(tmp_path, MISSING_IN_TEST, "--allow-missing-deps").returncode == 0


def test_session_where_no_test_ran_fails(tmp_path):
    done = run_pytest(tmp_path, NOTHING_RUNS)
    assert done.returncode == 1 and "none of the 1 collected tests ran" in done.stdout, done.stdout
    assert run_pytest(tmp_path, NOTHING_RUNS, "--collect-only").returncode == 0


@pytest.mark.parametrize("module", ["triton", "transformers", "matplotlib"])
def test_the_test_extra_is_installed(module):
    """What README's install command puts in place: the modules the test modules import."""
    __import__(module)
