"""A real SIGTERM to a 2-rank gloo job checkpointing through tiers (tests/workers/preempt_worker.py,
preempt_signal=SIGTERM, preempt_grace_s=20).

- one rank gets SIGTERM between saves: both ranks agree on one step, make it durable on the disk
  tier (straight there, not through memory first, unless its save was already issued), and exit
  with SIGTERM's status well within the grace period; that step is the disk's newest, the same
  record for both ranks, the first step to end after the signal, bit-exact;
- SIGTERM to both while a save is being written: the same; with persist_every so large that no
  save is persisted, that save is persisted from memory as the process ends;
- a second SIGTERM right after the first: both end at once; whatever is the disk's newest then is
  whole and bit-exact (the previous checkpoint, or the new one if it landed), never torn.
"""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

import pytest

import fastckpt
from support import warm
from support.paths import ROOT, WORKERS, python_path
from support.processes import Output, free_port

sys.path.insert(0, WORKERS)
from preempt_worker import state_for  # noqa: E402

pytestmark = pytest.mark.slow
GRACE_S = 20


class Job(Output):
    """Both ranks of preempt_worker.py, their output read as it comes."""

    def __init__(self, memory: str, disk: str, every: int, mb: int, persist_every: int = 1, gate: str = ""):
        port = free_port()
        procs = []
        for rank in (0, 1):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       PYTHONPATH=python_path(ROOT, WORKERS))
            procs.append(warm.popen([sys.executable, os.path.join(WORKERS, "preempt_worker.py"), memory, disk,
                                     str(every), str(mb), str(persist_every), *([gate] if gate else [])],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, env=env, start_new_session=True))
        super().__init__(procs)

    def last_step(self, rank: int) -> int:
        return max(self.steps(rank), default=0)


def newest_on_disk(disk: str):
    with fastckpt.Checkpointer(disk) as ck:
        info = ck.latest()
        states = [ck.load(rank=r) for r in (0, 1)] if info is not None else None
    return info, states


def exact(info, states, mb: int) -> bool:
    import torch
    return all(torch.equal(states[r]["w"], state_for(r, info.step, mb)["w"]) and states[r]["step"] == info.step
               for r in (0, 1))


@pytest.fixture
def places(tmp_path, shm):
    return os.path.join(shm, "memory-tier"), str(tmp_path / "disk")


def test_sigterm_to_one_rank_checkpoints_one_agreed_step_on_every_rank_and_exits(places):
    memory, disk = places
    job = Job(memory, disk, every=5, mb=2)
    job.wait_for(1, "saving")
    before = job.last_step(1)
    t = time.monotonic()
    os.kill(job.procs[1].pid, signal.SIGTERM)
    codes = job.ended(GRACE_S)
    took = time.monotonic() - t
    assert codes == [-signal.SIGTERM] * 2, (codes, job.text())
    info, states = newest_on_disk(disk)
    assert info is not None and info.step > before and info.world_size == 2
    ended = [job.last_step(r) for r in (0, 1)]
    assert info.step == ended[0] == ended[1], (info.step, ended)  # the step both ranks ended last
    assert exact(info, states, 2)
    if info.step % 5:  # not a step the loop saved: written straight to the disk, not through memory first
        assert not glob.glob(os.path.join(memory, "rank-*", f"step-{info.step:08d}.*")), info
    print(f"\nSIGTERM to rank 1 after step {before}: step {info.step} durable on disk, both exited in {took:.2f} s")


@pytest.mark.parametrize("mb, persist_every", [(48, 1), (8, 1000)], ids=["during a save", "persist_every=1000"])
def test_sigterm_as_a_save_is_issued_checkpoints_that_step_durably_and_exits(places, mb, persist_every):
    """SIGTERM to both ranks as a save is issued: that step is the one checkpointed (its save
    promoted), durable on the disk when both exit. 48 MiB a rank: the signal lands while it is
    written. persist_every=1000: the cadence persists no save, so the step is persisted from its
    memory copy at close, and it is the only one on the disk."""
    memory, disk = places
    gate = os.path.join(os.path.dirname(disk), "signalled")  # each rank holds its first save's step until
    job = Job(memory, disk, every=4, mb=mb, persist_every=persist_every, gate=gate)  # the signal is there
    job.wait_for(0, "saving")
    for p in job.procs:
        os.kill(p.pid, signal.SIGTERM)
    open(gate, "w").close()
    codes = job.ended(GRACE_S)
    assert codes == [-signal.SIGTERM] * 2, (codes, job.text())
    info, states = newest_on_disk(disk)
    assert info is not None and info.step == job.last_step(0) == job.last_step(1), job.text()
    assert exact(info, states, mb)
    if persist_every > 1:
        assert info.step % 4 == 0 and glob.glob(os.path.join(memory, "rank-*", f"step-{info.step:08d}.*")), info
        with fastckpt.Checkpointer(disk) as ck:
            assert [i.step for i in ck.list()] == [info.step]


def test_a_second_sigterm_ends_at_once_and_leaves_no_torn_checkpoint(places):
    memory, disk = places
    job = Job(memory, disk, every=2, mb=48)
    job.wait_for(0, "saving")
    codes = job.signal_twice(signal.SIGTERM, 0.05)  # ended within 5 s of the second
    assert codes == [-signal.SIGTERM] * 2, (codes, job.text())
    info, states = newest_on_disk(disk)
    if info is not None:  # the previous checkpoint, or the new one if it landed first: whole either way
        assert exact(info, states, 48)


@pytest.mark.parametrize("section, worker, names", [
    ("Lightning", "lit_preempt_worker.py", ("FastCheckpointIO", "ModelCheckpoint", "PreemptCheckpoint", "fit")),
    ("DeepSpeed", "ds_preempt_worker.py", ("at_step_end",)),
    ("FSDP2 through DCP", "fsdp2_worker.py", ("FastStorageWriter", "FastStager", "Preemption", "at_step_end",
                                              "async_save", "save"))])
def test_the_docs_preemption_blocks_make_the_calls_the_tests_make(section, worker, names):
    """docs/tiers.md's block for a framework runs as written (test_first_hour); each of its calls
    of the API, with its keyword names, is a call the worker its SIGTERM test runs makes too."""
    from support import readme_blocks
    from support.paths import ROOT, WORKERS
    missing = readme_blocks.calls_not_in(os.path.join(ROOT, "docs", "tiers.md"), section, "",
                                         os.path.join(WORKERS, worker), names)
    assert not missing, missing


def test_a_signal_to_each_rank_a_little_apart_is_each_ones_first_not_a_second(places):
    """As a cluster sends SIGTERM to every rank: rank 0's is agreed on first; rank 1's own, which
    comes while the checkpoint is being written, is its first signal (it does not end it at once)."""
    memory, disk = places
    job = Job(memory, disk, every=4, mb=48)
    job.wait_for(0, "saving")
    os.kill(job.procs[0].pid, signal.SIGTERM)
    job.wait_for(1, "fastckpt: preempted", 30)  # rank 1 agreed (it logs so) and is about to save
    os.kill(job.procs[1].pid, signal.SIGTERM)
    codes = job.ended(GRACE_S)
    assert codes == [-signal.SIGTERM] * 2, (codes, job.text())
    info, states = newest_on_disk(disk)
    assert info is not None and info.step == job.last_step(0) == job.last_step(1)
    assert exact(info, states, 48)
