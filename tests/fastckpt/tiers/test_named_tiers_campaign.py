"""kill -9 over a memory tier in front of named paths (fastckpt.store.named_tiers), as Lightning's
ModelCheckpoint saves them: each round a process resumes DIR/last.ckpt and then saves step after
step (tests/workers/named_tiers_worker.py) until it is killed (SIGKILL) at a random moment. Then:
  kill   the memory tier survived the process: the next resume reads the newest save of
         last.ckpt — never older than the last one reported committed — from memory or the file;
  wipe   the memory tier is removed (the node's memory lost): the next resume reads the file on
         disk, whatever step it holds.
Every round: the file on disk, when there, is whole (every CRC checked) and bit-exact its step's
state; the resume is bit-exact (checked by the worker); the hidden folders of copies to a path
that a kill cut short are the last process's alone (the next save sweeps them), none older than
the newest checkpoint. The campaign must have resumed from
memory and, after a wipe, from disk; with --many also from a memory copy newer than the file (a
kill between the commit in memory and the copy to disk). 12 rounds; 100 with --many.
"""
from __future__ import annotations

import glob
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

import fastckpt
from fastckpt.store.path_store import TMP_GLOB
from support.paths import ROOT, WORKERS, python_path

pytestmark = pytest.mark.slow
sys.path.insert(0, WORKERS)
from named_tiers_worker import state_for  # noqa: E402


class Child:
    """The worker, its stdout lines gathered as they come."""

    def __init__(self, memory: str, folder: str):
        self.lines: list[str] = []
        self.proc = subprocess.Popen([sys.executable, os.path.join(WORKERS, "named_tiers_worker.py"), memory, folder],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, PYTHONPATH=python_path(ROOT, WORKERS)))
        self._reader = threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stdout.readline, "")),
                                        daemon=True)
        self._reader.start()

    def wait_for(self, prefix: str, timeout: float = 120) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            hit = next((line for line in list(self.lines) if line.startswith(prefix)), None)
            if hit is not None:
                return hit
            assert self.proc.poll() is None, "".join(self.lines)[-3000:]
            time.sleep(0.01)
        raise AssertionError(f"no {prefix!r} line in {timeout} s:\n{''.join(self.lines)[-3000:]}")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._reader.join(10)

    def committed(self) -> int:
        return max([int(line.split()[1]) for line in self.lines if line.startswith("committed ")], default=0)


def left_behind(folder: str) -> list[tuple[int, float]]:
    """(the writer's pid, the modification time) of each hidden temporary file or folder in folder (a
    copy to a path cut short: .NAME.fastckpt-PID-N.tmp)."""
    out = []
    for path in glob.glob(os.path.join(folder, TMP_GLOB)):
        out.append((int(os.path.basename(path).rsplit(".fastckpt-", 1)[1].split("-")[0]), os.path.getmtime(path)))
    return out


def test_kill9_campaign_over_a_memory_tier_in_front_of_named_paths(tmp_path, shm, many):
    memory, folder = os.path.join(shm, "memory"), str(tmp_path / "ck")
    rng = random.Random(45)
    expect_at_least, expect_exactly, on_disk = 0, None, None
    seen = {"memory": 0, "memory newer than the file": 0, "disk after a wipe": 0, "left by the kill": 0}
    for round_ in range(100 if many else 12):
        child = Child(memory, folder)
        resumed = child.wait_for("resumed ").split()
        step, where = int(resumed[1]), resumed[2]
        assert step >= expect_at_least, f"round {round_}: resumed {step} from {where}, {expect_at_least} was committed"
        if expect_exactly is not None:
            assert (step, where) == expect_exactly, f"round {round_}: resumed {step} from {where}, not {expect_exactly}"
            seen["disk after a wipe"] += where == "disk"
        elif where == "memory":
            seen["memory"] += 1
            seen["memory newer than the file"] += on_disk is None or step > on_disk
        time.sleep(rng.uniform(0.2, 1.2))
        child.kill()
        left = left_behind(folder)
        assert all(pid == child.proc.pid for pid, _ in left), f"round {round_}: left by earlier rounds: {left}"
        newest = max((os.path.getmtime(p) for p in glob.glob(os.path.join(folder, "*.ckpt"))), default=0.0)
        assert all(when >= newest for _, when in left), f"round {round_}: older than the newest checkpoint: {left}"
        seen["left by the kill"] += bool(left)
        mode = rng.choice(("kill", "kill", "wipe"))
        last = os.path.join(folder, "last.ckpt")
        on_disk = None
        if os.path.exists(last):  # whole, and its step's state: never a torn mix
            got = fastckpt.load(last)
            on_disk = got["step"]
            want = state_for(on_disk)
            assert all(torch.equal(got[k], want[k]) for k in ("w", "b")), f"round {round_}: last.ckpt"
        if mode == "wipe":
            shutil.rmtree(memory, ignore_errors=True)
            expect_at_least, expect_exactly = 0, (on_disk, "disk") if on_disk is not None else (0, "none")
        else:
            expect_at_least, expect_exactly = child.committed(), None
    print(f"named tiers campaign: resumed from {seen}")
    assert seen["memory"] and seen["disk after a wipe"], seen
    assert not many or seen["memory newer than the file"], seen
