"""torchtitan_fastckpt against torchtitan itself (the wheel from the registry, pinned in setup.cfg):
its CheckpointManager, OptimizersContainer and LR schedulers, on 2 gloo ranks with FSDP2
(tests/workers/titan_worker.py, trained as torchtitan's Trainer trains, a checkpoint per step).

- Every async mode (disabled, async, async_with_pinned_mem): a run of 3 steps, then a new run
  that resumes (the manager's load(), newest) and trains to step 5; every step of both equals,
  bit for bit, the uninterrupted run's (model, optimizer, LR, train state), the resumed state
  equals step 3's, and the checkpoints are fastckpt's (committed by its record); once the
  manager is closed, no fastckpt thread is left.
- Concurrency: with step 1's commit held back, step 2's save call returns with both saves in
  flight (torchtitan's manager would wait for step 1's), and the run goes on bit-exact to its
  last step, whose synchronous save waits for the saves in flight.
- A run switched over from torchtitan's own manager resumes from the stock checkpoints' newest
  step (not from 0), saying so once, and goes on bit-exact.
- kill -9 of the coordinator inside step 3's commit: the resume is from step 2 (step 3's folder
  is passed over, with a warning); after a rank's file of step 2 is truncated, from step 1.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import pytest
import torch

pytest.importorskip("torchtitan", reason="torchtitan is a test dependency (setup.cfg: dev)")

from fastckpt.dcp import committed, newest_committed  # noqa: E402
from fastckpt.store.s3.client import bucket_for  # noqa: E402
from fastckpt.store.s3.place import S3Place  # noqa: E402
from support import readme_blocks, warm  # noqa: E402
from support.paths import ROOT, WORKERS, python_path  # noqa: E402
from support.processes import free_port  # noqa: E402
from support.states import equal  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled"), pytest.mark.timeout(900)]


def launch(manager: str, mode: str, ckpt, out, steps: int, **env) -> list[subprocess.Popen]:
    os.makedirs(out, exist_ok=True)
    port, procs = free_port(), []
    for rank in range(2):
        e = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                 PYTHONPATH=python_path(ROOT, WORKERS), **env)
        procs.append(warm.popen([sys.executable, os.path.join(WORKERS, "titan_worker.py"), manager, mode,
                                 str(ckpt), str(out), str(steps)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e,
                                start_new_session=True))
    return procs


def run(*args, **env) -> str:
    procs = launch(*args, **env)
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]
    return outs[0]


def state(out, name: str) -> dict:
    return torch.load(os.path.join(out, name), weights_only=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run, checkpointing off: each step's full state."""
    out = tmp_path_factory.mktemp("reference")
    run("none", "disabled", out / "unused", out, 5)
    return out


def loaded_step(log: str) -> int:
    return int(next(line for line in log.splitlines() if line.startswith("loaded ")).split()[1])


@pytest.mark.parametrize("mode", ["disabled", "async", "async_with_pinned_mem"])
def test_every_async_mode_saves_resumes_and_steps_bit_exact(tmp_path, reference, mode):
    ckpt = tmp_path / "ckpt"
    first = run("fast", mode, ckpt, tmp_path / "first", 3)
    assert loaded_step(first) == 0
    assert [info.step for info in committed(ckpt)] == [3, 2, 1]  # fastckpt's commits, every one
    second = run("fast", mode, ckpt, tmp_path / "second", 5)
    assert loaded_step(second) == 3
    assert "closed, fastckpt threads left: []" in first and "closed, fastckpt threads left: []" in second
    assert equal(state(tmp_path / "second", "loaded.pt"), state(reference, "state-3.pt"))
    for step in (1, 2, 3):
        assert equal(state(tmp_path / "first", f"state-{step}.pt"), state(reference, f"state-{step}.pt")), step
    for step in (4, 5):
        assert equal(state(tmp_path / "second", f"state-{step}.pt"), state(reference, f"state-{step}.pt")), step
    assert [info.step for info in committed(ckpt)] == [5, 4, 3]  # keep_latest_k=3


def test_a_bucket_as_the_folder_saves_resumes_and_keeps_the_newest_k_bit_exact(tmp_path, reference, s3_env):
    """CheckpointManager.Config(folder="s3://..."): every step's checkpoint committed in the bucket
    (fastckpt's record over its objects), a new run resumes from the newest there and trains on
    bit-exact, and keep_latest_k=3 leaves the objects of the newest three alone."""
    ckpt = f"s3://{s3_env.bucket}/titan-{uuid.uuid4().hex[:8]}"
    first = run("fast", "async", ckpt, tmp_path / "first", 3)
    assert loaded_step(first) == 0 and [info.step for info in committed(ckpt)] == [3, 2, 1]
    second = run("fast", "async", ckpt, tmp_path / "second", 5)
    assert loaded_step(second) == 3
    assert "closed, fastckpt threads left: []" in first and "closed, fastckpt threads left: []" in second
    assert equal(state(tmp_path / "second", "loaded.pt"), state(reference, "state-3.pt"))
    for step in (4, 5):
        assert equal(state(tmp_path / "second", f"state-{step}.pt"), state(reference, f"state-{step}.pt")), step
    assert [info.step for info in committed(ckpt)] == [5, 4, 3]
    place = S3Place.parse(ckpt)
    left = {o.key.split("/")[1] for o in bucket_for(place).listing(place.key(""))}
    assert left == {"step-3", "step-4", "step-5"}, left  # the pruned ones' objects deleted too


@pytest.mark.parametrize("mode", ["disabled", "async"])
def test_through_a_memory_tier_saves_are_persisted_and_a_resume_reads_memory_bit_exact(tmp_path, shm, reference,
                                                                                        mode):
    """CheckpointManager.Config(tiers=[memory]): every step's checkpoint is committed in the folder
    (each rank's file persisted there from its memory copy), and a resumed run loads step 3 from the
    memory copies and trains on bit-exact."""
    ckpt, memory = tmp_path / "ckpt", os.path.join(shm, "memory")
    first = run("fast", mode, ckpt, tmp_path / "first", 3, TIERS=memory)
    assert [info.step for info in committed(ckpt)] == [3, 2, 1] and "read nothing" in first
    assert "closed, fastckpt threads left: []" in first
    second = run("fast", mode, ckpt, tmp_path / "second", 5, TIERS=memory)
    assert loaded_step(second) == 3 and "read memory\n" in second, second[-3000:]
    assert equal(state(tmp_path / "second", "loaded.pt"), state(reference, "state-3.pt"))
    for step in (4, 5):
        assert equal(state(tmp_path / "second", f"state-{step}.pt"), state(reference, f"state-{step}.pt")), step


def test_a_save_does_not_wait_for_the_previous_one_and_two_stay_in_flight(tmp_path, reference):
    ckpt = tmp_path / "ckpt"
    log = run("fast", "async_with_pinned_mem", ckpt, tmp_path / "held", 8, HOLD_FIRST_COMMIT="1")
    assert "in flight 2" in log, log[-3000:]
    # step 8 is torchtitan's last step: a synchronous save, after every save in flight landed
    assert [info.step for info in committed(ckpt)] == [8, 7, 6]
    for step in (1, 2, 3, 4, 5):
        assert equal(state(tmp_path / "held", f"state-{step}.pt"), state(reference, f"state-{step}.pt")), step


def test_a_run_switched_from_stock_checkpoints_resumes_from_their_newest_step(tmp_path, reference):
    ckpt = tmp_path / "ckpt"
    run("stock", "disabled", ckpt, tmp_path / "stock", 3)
    assert committed(ckpt) == [] and sorted(os.listdir(ckpt)) == ["step-1", "step-2", "step-3"]
    switched = run("fast", "async", ckpt, tmp_path / "switched", 5)
    assert loaded_step(switched) == 3, switched[-3000:]
    assert "written by DCP's own writer" in switched
    assert switched.count("no fastckpt commit record") == 1, switched[-3000:]  # one warning per rank, as docs/dcp.md says
    assert equal(state(tmp_path / "switched", "loaded.pt"), state(reference, "state-3.pt"))
    for step in (4, 5):
        assert equal(state(tmp_path / "switched", f"state-{step}.pt"), state(reference, f"state-{step}.pt")), step
    newest = newest_committed(ckpt)
    assert (newest.step, newest.by) == (5, "fastckpt")


def test_a_kill_inside_the_commit_resumes_the_previous_step_and_a_truncated_file_is_not_picked(tmp_path, reference):
    ckpt = tmp_path / "ckpt"
    procs = launch("fast", "async", ckpt, tmp_path / "killed", 5, KILL_IN_COMMIT="3")
    log = procs[0].communicate(timeout=600)[0]
    assert procs[0].returncode == -signal.SIGKILL and "killing in commit 3" in log, log[-3000:]
    try:
        os.killpg(procs[1].pid, signal.SIGKILL)  # its peer is gone: it cannot finish the save's collectives
    except ProcessLookupError:
        pass
    procs[1].communicate(timeout=60)
    assert os.path.exists(ckpt / "step-3" / ".metadata")  # the commit began: DCP's probe would take step 3
    resumed = run("fast", "async", ckpt, tmp_path / "resumed", 4)
    assert loaded_step(resumed) == 2 and "step-3" in resumed and "never committed" in resumed
    assert equal(state(tmp_path / "resumed", "loaded.pt"), state(reference, "state-2.pt"))
    assert equal(state(tmp_path / "resumed", "state-3.pt"), state(reference, "state-3.pt"))
    assert equal(state(tmp_path / "resumed", "state-4.pt"), state(reference, "state-4.pt"))
    rank1 = ckpt / "step-4" / "__1_0.distcp"
    os.truncate(rank1, os.path.getsize(rank1) - 1)
    again = run("fast", "disabled", ckpt, tmp_path / "again", 3)
    assert loaded_step(again) == 3 and "step-4" in again and "truncated" in again
    assert equal(state(tmp_path / "again", "loaded.pt"), state(reference, "state-3.pt"))


def test_the_docs_torchtitan_call_is_the_one_this_test_makes():
    """The torchtitan block of docs/dcp.md runs as written (test_first_hour); its Config call, with
    its keyword names, is one tests/workers/titan_worker.py makes."""
    missing = readme_blocks.calls_not_in(os.path.join(ROOT, "docs", "dcp.md"), "torchtitan",
                                         "`torchtitan_fastckpt.CheckpointManager`", os.path.join(WORKERS, "titan_worker.py"),
                                         ("Config",))
    assert not missing, missing