"""A real SIGTERM to a Lightning training process (and to one rank of 2 under DDP) with
FastCheckpointIO and lightning_fastckpt.PreemptCheckpoint (tests/workers/lit_preempt_worker.py):

- every rank exits with SIGTERM's status well within the grace period (20 s);
- one checkpoint of the step every rank ended last is there, committed, holding exactly the
  dict Lightning built for it (a synchronous torch.save of it taken in on_save_checkpoint);
- resuming from it loads that step's state bit for bit (and trains on);
- a SIGTERM while ModelCheckpoint's saves of a large model are in flight, and a second SIGTERM
  right after the first (the process ends at once; whatever checkpoint is there is whole).
"""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import fastckpt
from support import warm
from support.paths import ROOT, WORKERS, python_path
from support.processes import Output, free_port

sys.path.insert(0, WORKERS)
from lit_app import assert_equal  # noqa: E402

pytestmark = pytest.mark.slow
WORKER = os.path.join(WORKERS, "lit_preempt_worker.py")
GRACE_S = 20


def start(out, *args, ddp: bool = False) -> Output:
    """lit_preempt_worker.py alone, or as 2 DDP ranks started as torchrun starts them."""
    os.makedirs(out, exist_ok=True)
    base = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": python_path(ROOT, WORKERS)}
    envs = [base]
    if ddp:
        port = free_port()
        envs = [{**base, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "NODE_RANK": "0",
                 "LOCAL_RANK": str(r), "RANK": str(r)} for r in (0, 1)]
    return Output([warm.popen([sys.executable, WORKER, str(out), *(["--ddp"] if ddp else []), *args], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preload=("lightning",),
                              start_new_session=True) for env in envs])


def check_preempted(out, run: Output) -> str:
    """The one preemption checkpoint: of the last step every rank ended, equal to what Lightning
    built for it; its path."""
    found = glob.glob(os.path.join(out, "ck", "preempted-step=*.ckpt"))
    assert len(found) == 1, (found, run.text())
    last = {max(run.steps(r)) for r in range(len(run.procs))}
    step = int(found[0].split("=")[-1].split(".")[0])
    assert last == {step}, (last, step)
    saved = fastckpt.load(found[0])
    assert saved["global_step"] == step
    sync = torch.load(os.path.join(out, "sync", f"step-{step}.pt"), weights_only=True)
    assert_equal({"state_dict": saved["state_dict"], "optimizer_states": saved["optimizer_states"]}, sync)
    return found[0]


@pytest.mark.parametrize("ddp", [False, True], ids=["one process", "2 DDP ranks"])
def test_sigterm_checkpoints_the_agreed_step_exits_and_resumes_bit_exact(tmp_path, ddp):
    out = str(tmp_path / "run")
    run = start(out, ddp=ddp)
    run.wait_step(5)
    t = time.monotonic()
    os.kill(run.procs[-1].pid, signal.SIGTERM)  # under DDP, rank 1 alone gets it
    codes = run.ended(GRACE_S)
    took = time.monotonic() - t
    assert codes == [-signal.SIGTERM] * len(run.procs), (codes, run.text())
    path = check_preempted(out, run)
    print(f"\nSIGTERM -> {os.path.basename(path)} durable, every rank exited in {took:.2f} s")
    again = start(str(tmp_path / "resumed"), "--resume", path)
    assert again.ended(120) == [0], again.text()
    loaded = torch.load(os.path.join(tmp_path, "resumed", "loaded-rank0.pt"), weights_only=True)
    saved = fastckpt.load(path)
    assert loaded["global_step"] == saved["global_step"]
    assert_equal(loaded["state_dict"], saved["state_dict"])


def test_after_a_sigterm_a_resume_from_last_resumes_from_the_sigterm_checkpoint(tmp_path):
    """ModelCheckpoint(save_last=True) every 4 steps beside PreemptCheckpoint in one folder: the
    SIGTERM comes after last.ckpt was saved at an earlier step. `fit(ckpt_path="last")` (the lines
    docs/tiers.md shows) resumes from the SIGTERM step, bit-exact — not from the older last.ckpt —
    and trains on; the next last.ckpt it saves is a file again, of that run."""
    out = str(tmp_path / "run")
    run = start(out, "--last", "4")
    run.wait_step(6)
    os.kill(run.procs[0].pid, signal.SIGTERM)
    assert run.ended(GRACE_S) == [-signal.SIGTERM], run.text()
    path = check_preempted(out, run)
    step = fastckpt.load(path)["global_step"]
    last = os.path.join(out, "ck", "last.ckpt")
    assert os.path.islink(last) and os.path.realpath(last) == os.path.realpath(path), os.listdir(os.path.dirname(last))
    again = start(out, "--last", "4", "--resume", "last", "--max-steps", str(step + 5))
    assert again.ended(120) == [0], again.text()
    loaded = torch.load(os.path.join(out, "loaded-rank0.pt"), weights_only=True)
    saved = fastckpt.load(path)
    assert loaded["global_step"] == step
    assert_equal(loaded["state_dict"], saved["state_dict"])
    assert max(again.steps(0)) == step + 5
    assert not os.path.islink(last) and fastckpt.load(last)["global_step"] > step


def test_sigterm_while_saves_are_in_flight_and_a_second_sigterm(tmp_path):
    out = str(tmp_path / "run")
    run = start(out, "--every", "2", "--big", "2048")  # 16 MiB a save, one every 2 steps
    run.wait_step(4)
    os.kill(run.procs[0].pid, signal.SIGTERM)
    assert run.ended(GRACE_S) == [-signal.SIGTERM], run.text()
    check_preempted(out, run)
    for path in glob.glob(os.path.join(out, "every", "*.ckpt")):  # every save that is there is whole
        fastckpt.load(path)
    out2 = str(tmp_path / "twice")
    run = start(out2, "--every", "2", "--big", "2048")
    run.wait_step(4)
    assert run.signal_twice(signal.SIGTERM) == [-signal.SIGTERM], run.text()  # ended within 5 s of the second
    for path in glob.glob(os.path.join(out2, "*", "*.ckpt")):  # never torn: a file there loads, CRCs and all
        fastckpt.load(path)
