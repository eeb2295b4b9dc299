"""make test-gpu's runner: one process per test, PASS / FAIL / HANG / SKIP lines, the exit status."""
from __future__ import annotations

import os
import subprocess
import sys

from support.paths import TESTS

RUNNER = os.path.join(TESTS, "support", "run_isolated.py")

CASES = '''
import time, pytest

def test_passes():
    assert 1 + 1 == 2

def test_fails():
    assert 1 + 1 == 3

def test_hangs():
    time.sleep(600)

@pytest.mark.skip(reason="not here")
def test_skips():
    pass
'''


def test_every_test_gets_its_own_line_and_a_hang_is_killed(tmp_path):
    (tmp_path / "test_cases.py").write_text(CASES)
    log = tmp_path / "log.txt"
    out = subprocess.run([sys.executable, RUNNER, "--timeout", "5", "--jobs", "2", "--log", str(log), "--",
                          str(tmp_path / "test_cases.py")], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    lines = {line.split()[-1].split("::")[-1]: line.split()[0] for line in out.stdout.splitlines() if "::" in line}
    assert lines == {"test_passes": "PASS", "test_fails": "FAIL", "test_hangs": "HANG", "test_skips": "SKIP"}, out.stdout
    assert out.returncode == 1
    assert "killed after 5 s" in log.read_text()


def test_all_skipped_is_not_a_pass(tmp_path):
    (tmp_path / "test_cases.py").write_text(CASES)
    out = subprocess.run([sys.executable, RUNNER, "--timeout", "30", "--", str(tmp_path / "test_cases.py"),
                          "-k", "skips"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 3 and "no test ran" in out.stdout, out.stdout


def test_no_test_starts_after_the_deadline(tmp_path):
    """--deadline bounds a device call: a test whose turn comes after it is not started (NOTRUN)
    and the run fails, so a check cut short never reads as passed."""
    (tmp_path / "test_cases.py").write_text(CASES)
    out = subprocess.run([sys.executable, RUNNER, "--timeout", "10", "--jobs", "1", "--deadline", "0", "--",
                          str(tmp_path / "test_cases.py"), "-k", "passes or skips"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    lines = [line.split()[0] for line in out.stdout.splitlines() if "::" in line]
    assert lines == ["NOTRUN", "NOTRUN"], out.stdout
    assert "NOTRUN 2" in out.stdout and out.returncode == 1


def test_one_per_file_runs_the_first_test_of_each_file_and_lists_the_rest(tmp_path):
    (tmp_path / "test_cases.py").write_text(CASES)
    (tmp_path / "test_more.py").write_text("def test_a():\n    pass\n\ndef test_b():\n    assert False\n")
    out = subprocess.run([sys.executable, RUNNER, "--timeout", "30", "--jobs", "2", "--one-per-file", "--",
                          str(tmp_path), "-k", "not hangs"], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    lines = {line.split()[-1].split("::")[-1]: line.split()[0] for line in out.stdout.splitlines() if "::" in line}
    assert lines == {"test_passes": "PASS", "test_fails": "SAMPLED", "test_skips": "SAMPLED",
                     "test_a": "PASS", "test_b": "SAMPLED"}, out.stdout
    assert "PASS 2 FAIL 0" in out.stdout and out.returncode == 0
    one = subprocess.run([sys.executable, RUNNER, "--timeout", "30", "--one-per-file", "--files", "1", "--",
                          str(tmp_path), "-k", "not hangs"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    ran = [line for line in one.stdout.splitlines() if "::" in line and not line.startswith("SAMPLED")]
    assert len(ran) == 1 and ran[0].split()[-1].endswith("test_cases.py::test_passes"), one.stdout
    assert "PASS 1 FAIL 0" in one.stdout and one.returncode == 0
