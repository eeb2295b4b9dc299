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


def outputs_of(procs: list, timeout: float, what: str) -> list[str]:
    """Each process's whole output (stdout, stderr merged) once all ended; one still running after
    timeout seconds is a hang: all are killed and an AssertionError shows the end of each output."""
    try:
        return [p.communicate(timeout=timeout)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        tails = [p.communicate()[0][-3000:] for p in procs]
        raise AssertionError(f"{what}: the ranks hung (killed after {timeout:g} s):\n" + "\n---\n".join(tails))


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


class Output:
    """What started processes print, line by line as it comes (a reader thread each), for a test
    that acts on it: a signal once a rank printed a line, then each one's exit status."""

    def __init__(self, procs: list):
        self.procs = procs
        self.lines: list[list[str]] = [[] for _ in procs]
        self.changed = threading.Condition()
        self.readers = [threading.Thread(target=self._read, args=(i,), daemon=True) for i in range(len(procs))]
        for t in self.readers:
            t.start()

    def _read(self, i: int) -> None:
        for line in self.procs[i].stdout:
            with self.changed:
                self.lines[i].append(line)
                self.changed.notify_all()

    def wait_for(self, i: int, prefix: str, timeout: float = 120.0) -> str:
        """Until process i printed a line starting with prefix; that line."""
        end = time.monotonic() + timeout
        with self.changed:
            while True:
                found = next((line for line in self.lines[i] if line.startswith(prefix)), None)
                if found is not None:
                    return found
                left = end - time.monotonic()
                assert left > 0, f"process {i} never printed {prefix!r}:\n{self.text(i)}"
                self.changed.wait(left)

    def steps(self, i: int) -> list[int]:
        """The N of every "step N" line process i printed."""
        with self.changed:
            return [int(x.split()[1]) for x in self.lines[i] if x.startswith("step ")]

    def wait_step(self, n: int, timeout: float = 180.0) -> None:
        """Until every process printed "step M" with M >= n."""
        end = time.monotonic() + timeout
        with self.changed:
            while not all(any(s >= n for s in self.steps(i)) for i in range(len(self.procs))):
                left = end - time.monotonic()
                assert left > 0, f"not every process reached step {n}:\n{self.text()}"
                self.changed.wait(left)

    def signal_twice(self, signum: int, gap_s: float = 0.02) -> list:
        """signum to every process, and again gap_s later; each one's exit status (all must end
        within 5 s of the second: a second signal ends a process at once)."""
        for p in self.procs:
            os.kill(p.pid, signum)
        time.sleep(gap_s)
        for p in self.procs:
            try:
                os.kill(p.pid, signum)
            except ProcessLookupError:
                pass
        return self.ended(5.0)

    def text(self, i=None) -> str:
        with self.changed:
            return "\n".join("".join(self.lines[j])[-3000:] for j in ([i] if i is not None else range(len(self.procs))))

    def ended(self, timeout: float) -> list:
        """Each process's exit status once all ended; killed (and the test failed) when they do
        not within timeout."""
        end = time.monotonic() + timeout
        try:
            for p in self.procs:
                p.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in self.procs:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    p.kill()
                p.wait(60)
            raise AssertionError(f"a process did not end within {timeout:g} s:\n{self.text()}") from None
        for t in self.readers:
            t.join(10)
        return [p.returncode for p in self.procs]
