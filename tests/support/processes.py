"""Test programs as processes: a free port for their process group, and killing one at a random
moment once it says it is ready."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

from . import warm
from .paths import ROOT, WORKERS, python_path


def free_port() -> int:
    """A TCP port nobody listens on now (MASTER_PORT of a group of test ranks)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_at_random(script: str, args: list[str], rng, max_delay: float, on_line) -> None:
    """Runs tests/workers/SCRIPT ARGS; once it prints "ready", kills it with SIGKILL after a
    random delay of up to max_delay seconds. Every other line it printed goes to on_line()."""
    env = dict(os.environ, PYTHONPATH=python_path(ROOT, WORKERS))
    proc = warm.popen([sys.executable, os.path.join(WORKERS, script), *args], stdout=subprocess.PIPE,
                      text=True, env=env)
    ready = threading.Event()

    def read():
        for line in proc.stdout:
            if line.startswith("ready"):
                ready.set()
            else:
                on_line(line)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    assert ready.wait(60), f"{script} never started"
    time.sleep(rng.uniform(0.0, max_delay))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    t.join()


def kill_ranks(procs: list, victims: list) -> None:
    """Kills victims' process groups with SIGKILL, then (their peers cannot finish a collective
    without them) every other rank's, and reaps them all."""
    for p in victims:
        os.killpg(p.pid, signal.SIGKILL)
    time.sleep(0.5)
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(60)
