"""tests/support/warm.py: a program forked from the warm interpreter sees what a cold `python`
start gives it (argv, sys.path, cwd, environment, threads, its own session, __main__), ends as
it does (exit status, traceback, atexit, threads joined, a signal's status), and where a warm
start would differ (LD_PRELOAD, a start-up variable) it is started cold."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from support import warm
from support.paths import ROOT, python_path

PROBE = textwrap.dedent("""\
    import atexit, json, os, sys, threading, time
    import torch
    def late():
        time.sleep(0.2)
        print("thread joined", flush=True)
    threading.Thread(target=late).start()
    atexit.register(lambda: print("atexit ran", flush=True))
    print(json.dumps({"argv": sys.argv, "path": sys.path[:3], "cwd": os.getcwd(), "x": os.environ.get("X"),
                      "threads": torch.get_num_threads(), "own_group": os.getpgrp() == os.getpid(),
                      "name": __name__, "file": globals().get("__file__"),
                      "support": "support" in sys.modules}), flush=True)
    sys.exit(int(os.environ.get("CODE", "0")))
""")


def probe(tmp_path, cold: bool, **kw) -> tuple[dict, subprocess.CompletedProcess]:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = dict(os.environ, X="seen", OMP_NUM_THREADS="1", PYTHONPATH=python_path(str(tmp_path)), CODE="3",
               **({"FASTCKPT_TEST_COLD": "1"} if cold else {}))
    done = warm.run([sys.executable, str(script), "a", "b"], env=env, cwd=str(tmp_path), capture_output=True,
                    text=True, timeout=120, start_new_session=True, **kw)
    first = done.stdout.splitlines()[0]
    return json.loads(first), done


def test_a_warm_program_sees_and_ends_as_a_cold_one(tmp_path):
    got, done = probe(tmp_path, cold=False)
    want, cold = probe(tmp_path, cold=True)
    assert got == want
    assert got["argv"] == [str(tmp_path / "probe.py"), "a", "b"] and got["path"][:2] == [str(tmp_path)] * 2
    assert got["threads"] == 1 and got["own_group"] and got["name"] == "__main__" and not got["support"]
    assert done.returncode == cold.returncode == 3
    assert done.stdout.splitlines()[1:] == cold.stdout.splitlines()[1:] == ["thread joined", "atexit ran"]


def test_it_was_forked_warm(tmp_path):
    """The warm interpreter imported torch before the program started: it is loaded before the
    program's first line (a cold start has only the interpreter's own modules there)."""
    (tmp_path / "t.py").write_text("import sys\nprint('torch' in sys.modules)\n")
    done = warm.run([sys.executable, str(tmp_path / "t.py")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "True\n", done.stderr
    cold = warm.run([sys.executable, str(tmp_path / "t.py")], capture_output=True, text=True, timeout=120,
                    env=dict(os.environ, FASTCKPT_TEST_COLD="1"))
    assert cold.returncode == 0 and cold.stdout == "False\n", cold.stderr
    proc = warm.popen([sys.executable, str(tmp_path / "t.py")], stdout=subprocess.DEVNULL)
    assert isinstance(proc, warm.WarmProcess) and proc.wait(60) == 0


def test_a_traceback_and_status_1_as_python_gives_them(tmp_path):
    done = warm.run([sys.executable, "-c", "import sys; print('out'); raise ValueError('boom ' + sys.argv[1])", "x"],
                    capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == "out\n"
    assert "Traceback (most recent call last)" in done.stderr and "ValueError: boom x" in done.stderr


def test_a_module_runs_as_with_dash_m(tmp_path):
    env = dict(os.environ, PYTHONPATH=python_path(ROOT))
    done = warm.run([sys.executable, "-m", "fastckpt.tools.cli", "--help"], env=env, capture_output=True,
                    text=True, timeout=60)
    assert done.returncode == 0 and "usage" in done.stdout.lower(), done.stderr


def test_kill_9_ends_it_with_that_signal_and_its_lines_are_read_as_they_come(tmp_path):
    proc = warm.popen([sys.executable, "-u", "-c", "pass"])  # a start-up option: started cold
    assert isinstance(proc, subprocess.Popen)
    proc.wait(60)
    proc = warm.popen([sys.executable, "-c", "import time\nprint('ready', flush=True)\ntime.sleep(600)"],
                      stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.1)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    proc.stdout.close()


def test_a_stateful_shim_or_startup_variable_starts_cold():
    env = dict(os.environ, LD_PRELOAD="")
    assert warm._warm_key([sys.executable, "x.py"], env, ()) is not None  # empty: nothing preloaded
    env["LD_PRELOAD"] = "/x/record_shim.so"  # state from the first instruction on
    assert warm._warm_key([sys.executable, "x.py"], env, ()) is None
    env["LD_PRELOAD"] = "/x/eio_shim.so"  # settings read at each call: a warm interpreter with it
    assert ("LD_PRELOAD", "/x/eio_shim.so") in warm._warm_key([sys.executable, "x.py"], env, ())[1]
    assert warm._warm_key([sys.executable, "x.py"], dict(os.environ, PYTHONHASHSEED="0"), ()) is None
    assert warm._warm_key(["/usr/bin/env", "x.py"], dict(os.environ), ()) is None
    a = warm._warm_key([sys.executable, "x.py"], dict(os.environ, DS_ACCELERATOR="cpu"), ("deepspeed",))
    b = warm._warm_key([sys.executable, "x.py"], dict(os.environ, DS_ACCELERATOR="cuda"), ("deepspeed",))
    assert a != b  # read when deepspeed is imported: each its own warm interpreter


def test_the_default_folder_is_the_tests_current_one(tmp_path, monkeypatch):
    here = [sys.executable, "-c", "import os; print(os.getcwd())"]
    assert warm.run(here, capture_output=True, text=True, timeout=60).returncode == 0  # the interpreter is up
    monkeypatch.chdir(tmp_path)
    assert warm.run(here, capture_output=True, text=True, timeout=60).stdout.strip() == str(tmp_path)
