"""A checkpoint that fails on one rank is raised at the same call on every rank, or on none — never
on one rank while the other goes on into the next collective and waits there for the process
group's timeout. 2 real gloo ranks (tests/workers/agreed_errors_worker.py); rank 0's file of the
second checkpoint fails as it is written (the fault shim: EIO), and rank 1's thread records that
outcome 6 s late. (DeepSpeed: tests/deepspeed_fastckpt/test_deepspeed_export.py; Lightning under
DDP: tests/lightning_fastckpt/test_lightning_ddp.py.)"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from support import warm
from support.paths import ROOT, WORKERS, python_path
from support.processes import free_port, outputs_of

pytestmark = pytest.mark.slow


def run_ranks(mode: str, root, out, fault: str, fault_shim: str, timeout: float = 60) -> list[dict]:
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PYTHONPATH=python_path(ROOT, WORKERS), LD_PRELOAD=fault_shim, FASTCKPT_FAULT_PATH=fault,
                   HOLD_RANK="1", HOLD_S="6")
        procs.append(warm.popen([sys.executable, os.path.join(WORKERS, "agreed_errors_worker.py"), mode, str(root),
                                 str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
    logs = outputs_of(procs, timeout, mode)
    for rank, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {rank} exited {p.returncode}:\n{log[-4000:]}"
    return [torch.load(f"{out}.{rank}", weights_only=False) for rank in (0, 1)]


def test_a_checkpointer_save_raises_on_every_rank_at_the_same_save(tmp_path, fault_shim):
    root = tmp_path / "ck"
    t = time.monotonic()
    got = run_ranks("checkpointer", root, tmp_path / "out", "step-00000002.c000002/rank-0.pt", fault_shim)
    for rank, out in enumerate(got):
        assert out["raised_at"] == 3 and out["took_s"] < 30, (rank, out)
        assert "close_error" not in out, (rank, out)  # said once, not again at close
    assert "Input/output error" in got[0]["error"] and "said by rank 0" in got[1]["error"], got
    assert time.monotonic() - t < 60
    import fastckpt
    with fastckpt.Checkpointer(str(root)) as ck:
        assert [i.step for i in ck.list()] == [1]


def test_a_dcp_save_raises_on_every_rank(tmp_path, fault_shim):
    root = tmp_path / "dcp"
    got = run_ranks("dcp", root, tmp_path / "out", "step-2/.__0_0", fault_shim)
    for rank, out in enumerate(got):
        assert out["raised_at"] == 2, (rank, out)
        assert "close_error" not in out, (rank, out)
    from fastckpt.dcp import newest_committed
    assert os.path.basename(newest_committed(str(root))) == "step-1"


def test_ranks_given_different_steps_at_one_save_raise_together_and_write_nothing(tmp_path, fault_shim):
    """One checkpoint holds one step: a save whose ranks were given different steps is a ValueError
    on every rank at that call (checked in the all-reduce the save makes anyway), nothing of it is
    written, and the next save with one step goes on."""
    root = tmp_path / "ck"
    got = run_ranks("steps", root, tmp_path / "out", "no-fault-here", fault_shim)
    for rank, out in enumerate(got):
        assert out["raised_at"] == 2 and out["error"].startswith("ValueError"), (rank, out)
        assert "step 2 on one rank and step 3 on another" in out["error"], out
    import fastckpt
    with fastckpt.Checkpointer(str(root)) as ck:
        assert [i.step for i in ck.list()] == [4, 1]
