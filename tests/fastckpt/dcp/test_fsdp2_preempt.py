"""A real SIGTERM to one rank of a 2-rank FSDP2 job (gloo, CPU) saving through fastckpt.dcp, with
fastckpt.dcp.Preemption's at_step_end after every step (tests/workers/fsdp2_worker.py preempt):

- both ranks exit with SIGTERM's status within the grace period;
- the newest committed checkpoint of the folder is the step both ranks ended last (the async
  saves in flight landed first, and are older);
- resuming from it (fsdp2_worker.py resume) loads exactly the full state rank 0 kept at that step;
- a second SIGTERM right after the first ends the job at once, and the newest committed checkpoint
  then resumes (whole).
"""
from __future__ import annotations

import os
import signal

import pytest
import torch

from fastckpt.dcp import newest_committed
from support.processes import Output
from test_fsdp2 import equal, finish, launch

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]
GRACE_S = 20


def job(ckpt, ref) -> Output:
    os.makedirs(ref, exist_ok=True)
    return Output(launch(["preempt", ckpt, ref], 2))


def resumed_state(ckpt, out):
    os.makedirs(out, exist_ok=True)
    finish(launch(["resume", ckpt, out], 2))
    return torch.load(os.path.join(out, "loaded.pt"), weights_only=True)


def test_sigterm_to_one_fsdp2_rank_saves_the_agreed_step_and_it_resumes_bit_exact(tmp_path):
    ckpt, ref = str(tmp_path / "ckpt"), str(tmp_path / "ref")
    run = job(ckpt, ref)
    run.wait_step(4)  # an async save of step 3 in flight or landed
    os.kill(run.procs[1].pid, signal.SIGTERM)
    assert run.ended(GRACE_S) == [-signal.SIGTERM] * 2, run.text()
    last = {max(run.steps(r)) for r in (0, 1)}
    assert len(last) == 1, last
    n = last.pop()
    assert newest_committed(ckpt).step == n
    assert equal(resumed_state(ckpt, str(tmp_path / "out")), torch.load(os.path.join(ref, f"step-{n}.pt"),
                                                                          weights_only=True))


def test_a_second_sigterm_ends_the_fsdp2_job_at_once_and_the_newest_committed_resumes(tmp_path):
    ckpt, ref = str(tmp_path / "ckpt"), str(tmp_path / "ref")
    run = job(ckpt, ref)
    run.wait_step(4)
    assert run.signal_twice(signal.SIGTERM, 0.01) == [-signal.SIGTERM] * 2  # ended within 5 s of the second
    newest = newest_committed(ckpt)
    if newest is not None:  # whole: it resumes, every CRC checked, to the state kept at its step
        assert equal(resumed_state(ckpt, str(tmp_path / "out")),
                     torch.load(os.path.join(ref, f"step-{newest.step}.pt"), weights_only=True))
