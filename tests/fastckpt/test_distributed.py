"""Two real gloo ranks: per-rank files, global commit, same latest() everywhere, rank killed
mid-commit, a rank alive whose file fails."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

import fastckpt

from support import warm
from support.paths import ROOT, WORKERS, python_path
from support.processes import free_port
from workers.dist_worker import state_for  # noqa: E402


def launch(mode: str, root: str, world: int = 2, store: str = "root", env_of: dict | None = None) -> list[subprocess.Popen]:
    """Every rank of dist_worker.py MODE; env_of: rank -> environment of that rank alone."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), PYTHONPATH=python_path(ROOT, WORKERS), **(env_of or {}).get(rank, {}))
        procs.append(warm.popen([sys.executable, os.path.join(WORKERS, "dist_worker.py"), mode, root, store],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
    return procs


def where(request, tmp_path, store: str) -> tuple[str, dict]:
    """(root, reader kwargs): a directory for the file store, a pool on /dev/shm for pmem."""
    if store == "root":
        return str(tmp_path), {}
    return os.path.join(request.getfixturevalue("shm"), "dist.pool"), {"store": "pmem"}


@pytest.mark.parametrize("store", ["root", "pmem"])
def test_two_ranks_roundtrip(request, tmp_path, store):
    root, reader = where(request, tmp_path, store)
    procs = launch("roundtrip", root, store=store)
    outs = [p.communicate(timeout=180)[0] for p in procs]
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, out
        assert f"rank {rank} OK 5" in out
    info = fastckpt.Checkpointer(root, **reader).latest()
    assert info.step == 5 and sorted(f.rank for f in info.files) == [0, 1]
    for rank in (0, 1):
        out = fastckpt.Checkpointer(root, **reader).load(rank=rank)
        assert torch.equal(out["w"], state_for(rank, 5)["w"])


@pytest.mark.parametrize("store", ["root", "pmem"])
def test_rank_killed_mid_commit_keeps_previous_global(request, tmp_path, store):
    root, reader = where(request, tmp_path, store)
    rng = random.Random(7)
    for attempt in range(3):
        procs = launch("loop", root, store=store)
        committed = [0, 0]
        ready = [threading.Event(), threading.Event()]

        def read(i):
            for line in procs[i].stdout:
                if line.startswith("ready"):
                    ready[i].set()
                elif line.startswith("committed"):
                    committed[i] = max(committed[i], int(line.split()[1]))

        threads = [threading.Thread(target=read, args=(i,), daemon=True) for i in (0, 1)]
        for t in threads:
            t.start()
        assert all(r.wait(90) for r in ready)
        time.sleep(rng.uniform(0.3, 1.0))
        procs[1].send_signal(signal.SIGKILL)  # rank 1 dies wherever it is
        procs[1].wait()
        try:
            procs[0].wait(timeout=60)  # rank 0 notices through the commit timeout
        except subprocess.TimeoutExpired:
            procs[0].kill()
            procs[0].wait()
        for t in threads:
            t.join(5)
        ck = fastckpt.Checkpointer(root, **reader)
        info = ck.latest()
        assert info is not None and info.world_size == 2
        assert info.step >= max(committed), (info.step, committed)
        for rank in (0, 1):
            out = ck.load(rank=rank)
            assert out["step"] == info.step and torch.equal(out["w"], state_for(rank, info.step)["w"])


def test_a_rank_that_stays_alive_and_fails_its_file_commits_nothing_on_any_rank(tmp_path, fault_shim):
    """Rank 1's file of step 2 fails to write (EIO) and rank 1 says so: rank 0, whose own file is
    durable, must not write the record nor move `latest` — every rank is told step 2 failed and
    step 1 stays the newest. (Rank 0 checking only its own result committed step 2.)"""
    procs = launch("one-fails", str(tmp_path), env_of={1: {"LD_PRELOAD": fault_shim, "FASTCKPT_FAULT_PATH":
                                                            "step-00000002", "FASTCKPT_FAULT_AFTER": "0"}})
    outs = [p.communicate(timeout=180)[0] for p in procs]
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, out
        assert f"rank {rank} failed" in out and "latest on each rank [1, 1]" in out, out
    assert fastckpt.Checkpointer(str(tmp_path)).latest().step == 1
    assert not any((d / "COMMIT").exists() for d in tmp_path.glob("step-00000002.*"))
