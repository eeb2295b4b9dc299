"""Record a program's file operations under a root, then judge every disk a power loss could
have left at every moment of it.

    shim = build_shim(tmp)                                   # record_shim.c as a library
    rec = record(shim, root, [sys.executable, SAVES, "root", root])
    verdict = judge(rec, check, work)                        # check(folder, marks) -> problems
    assert verdict.problems == [] and verdict.states > 0

The program marks what it was told (saves.mark(root, "committed:3") after ck.wait() returned)
so that a check knows which checkpoints the disk owes it at each crash point.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Callable

from .disk import Replay, Snapshot, fingerprint, materialize
from .oplog import Op, read_log

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM_SRC = os.path.join(HERE, "record_shim.c")
SAVES = os.path.join(HERE, "saves.py")  # the recorded programs


def build_shim(out_dir: str) -> str:
    so = os.path.join(out_dir, "record_shim.so")
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", so, SHIM_SRC, "-ldl", "-lpthread"], check=True,
                   capture_output=True)
    return so


@dataclass
class Recording:
    root: str
    snapshot: Snapshot
    ops: list[Op]
    output: str = ""


def record(shim: str, root: str, argv: list[str], env: dict | None = None, timeout: float = 600) -> Recording:
    """Runs argv (every process it starts included) with the shim recording under root."""
    root = os.path.abspath(root)
    os.makedirs(root, exist_ok=True)
    snapshot = Snapshot.take(root)
    log = os.path.join(os.path.dirname(root), os.path.basename(root) + ".simlog")
    for p in (log, log + ".seq"):
        if os.path.exists(p):
            os.unlink(p)
    run_env = dict(os.environ, **(env or {}), LD_PRELOAD=shim, FASTCKPT_SIM_ROOT=root, FASTCKPT_SIM_LOG=log)
    proc = subprocess.run(argv, env=run_env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise AssertionError(f"the recorded program exited {proc.returncode}:\n{out[-4000:]}")
    return Recording(root, snapshot, read_log(log) if os.path.exists(log) else [], out)


@dataclass
class Verdict:
    crash_points: int = 0
    states: int = 0  # distinct disks judged (with what the program had been told by then)
    problems: list[str] = field(default_factory=list)


def judge(rec: Recording, check: Callable[[str, list[str]], list[str]], work: str, most: int = 8) -> Verdict:
    """Every crash point, every disk it can leave, materialized under work and checked; the
    first `most` problems are kept (each says the crash point and what survived)."""
    replay = Replay(rec.root, rec.snapshot, rec.ops)
    verdict, seen = Verdict(), set()
    folder = os.path.join(work, os.path.basename(rec.root))
    points = replay.crash_points()
    verdict.crash_points = len(points)
    for c in points:
        marks = replay.committed_marks(c)
        for label, metas, datas in replay.states(c):
            disk = replay.disk(metas, datas)
            key = (fingerprint(disk), tuple(marks))
            if key in seen:
                continue
            seen.add(key)
            shutil.rmtree(folder, ignore_errors=True)
            materialize(disk, folder)
            for problem in check(folder, marks):
                if len(verdict.problems) < most:
                    verdict.problems.append(f"crash before op {c} of {len(rec.ops)} ({label}; told: "
                                            f"{', '.join(marks) or 'nothing'}): {problem}")
    verdict.states = len(seen)
    shutil.rmtree(folder, ignore_errors=True)
    return verdict
