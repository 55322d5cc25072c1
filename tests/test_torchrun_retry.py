"""tests/torchrun.py: a launch whose rank dies of a signal runs once more, and is recorded for the session's
summary (conftest.py); a rank that fails by exiting with an error is not retried. The ranks here are
scripts that import nothing but os and sys."""
import textwrap

import torchrun

ABORT_ONCE = """
    import os, sys
    marker = sys.argv[1]
    if os.environ["RANK"] == "1" and not os.path.exists(marker):
        open(marker, "w").close()
        os.abort()
"""
ALWAYS_ABORT = """
    import os
    if os.environ["RANK"] == "1":
        os.abort()
"""
EXIT_WITH_ERROR = """
    import os, sys
    sys.exit(3 if os.environ["RANK"] == "1" else 0)
"""


def launch(tmp_path, source: str):
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(source))
    seen = len(torchrun.RETRIED)
    proc = torchrun.torchrun(2, [str(script), str(tmp_path / "marker")], timeout=120)
    new = torchrun.RETRIED[seen:]
    del torchrun.RETRIED[seen:]      # deliberate crashes: not for the session's summary
    return proc, new


def test_a_rank_killed_once_by_a_signal_is_rerun_and_recorded(tmp_path):
    proc, new = launch(tmp_path, ABORT_ONCE)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(new) == 1 and "Signal 6 (SIGABRT)" in new[0] and "it passed on its second run" in new[0], new


def test_a_second_crash_fails(tmp_path):
    proc, new = launch(tmp_path, ALWAYS_ABORT)
    assert proc.returncode != 0
    assert len(new) == 1 and "it failed again (Signal 6 (SIGABRT)" in new[0], new
    # faulthandler's report from the crashed rank, with the line that aborted, for both runs
    assert new[0].count("Fatal Python error: Aborted") == 2 and "rank.py\", line 4" in new[0], new


def test_an_error_exit_is_not_rerun(tmp_path):
    proc, new = launch(tmp_path, EXIT_WITH_ERROR)
    assert proc.returncode != 0 and new == [], new
    assert not (tmp_path / "marker").exists()
