"""A copy behind the memory tier that fails (the disk full: a real tmpfs too small for it) leaves its
checkpoint uncommitted on that tier in every caller, the previous one the latest there, nothing of
the failed copy left, and the failure said once: the Checkpointer's steps, a path saved through
FastCheckpointIO, a DCP checkpoint (here, one process); DeepSpeed's tags on 2 ranks:
tests/deepspeed_fastckpt/test_deepspeed_export.py."""
from __future__ import annotations

import glob
import os

import pytest
import torch

import fastckpt
from fastckpt.errors import CheckpointWriteError
from support.states import assert_same


def small(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(64, 1024, generator=g), "step": step}  # 256 KiB


def big(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(1024, 1024, generator=g), "step": step}  # 4 MiB: more than the disk holds


@pytest.fixture
def full_disk(mount_tmpfs) -> str:
    """A disk of 2 MiB: room for a small checkpoint, not for a big one."""
    return mount_tmpfs(2 << 20)


def test_a_step_whose_copy_to_the_disk_fails_is_not_committed_there(shm, full_disk):
    disk = os.path.join(full_disk, "disk")
    with fastckpt.Checkpointer(tiers=[os.path.join(shm, "memory"), disk], tier_keep=[2, 2]) as ck:
        ck.save(small(1), 1).wait()
        ck.wait()
        ck.save(big(2), 2).wait()  # committed in memory
        with pytest.raises(CheckpointWriteError, match="the copy of step 2") as got:
            ck.wait()
        assert "No space left" in str(got.value) or "errno 28" in str(got.value)
        assert ck.stats["persist_failed"] == 1
        assert sorted(ck.store.holding()) == [1, 2] and ck.store.holding()[2] == [os.path.abspath(ck.store.places[0])]
    with fastckpt.Checkpointer(disk) as on_disk:
        assert [i.step for i in on_disk.list()] == [1]
        assert on_disk.latest().step == 1
        assert_same(small(1), on_disk.load())
    assert [n for n in os.listdir(disk) if n != "latest"] == [os.path.basename(on_disk.latest().path)]


def test_a_path_whose_copy_fails_keeps_its_previous_save(shm, full_disk):
    """FastCheckpointIO(tiers=...) outside a run: each save is durable when it returns, so the failed
    copy is raised by that save; the path keeps the save before, and no hidden folder is left."""
    from lightning_fastckpt import FastCheckpointIO
    io = FastCheckpointIO(tiers=[os.path.join(shm, "memory")])
    path = os.path.join(full_disk, "last.ckpt")
    io.save_checkpoint(small(1), path)
    with pytest.raises(CheckpointWriteError, match="last.ckpt"):
        io.save_checkpoint(big(2), path)
    io.teardown()  # raises nothing more: the failure was said once
    assert_same(small(1), fastckpt.load(path))
    assert os.listdir(full_disk) == ["last.ckpt"]


def test_a_dcp_checkpoint_whose_copy_fails_is_not_committed(shm, full_disk):
    import torch.distributed.checkpoint as dcp

    from fastckpt.dcp import FastStorageWriter, newest_committed
    memory = [os.path.join(shm, "memory")]
    for step, state in ((1, small(1)), (2, big(2))):
        writer = FastStorageWriter(os.path.join(full_disk, f"step-{step}"), tiers=memory)
        if step == 1:
            dcp.save(state, storage_writer=writer)
        else:
            with pytest.raises(BaseException, match="No space left|errno 28"):  # DCP's CheckpointException
                dcp.save(state, storage_writer=writer)
        writer.close()
    assert os.path.basename(newest_committed(full_disk)) == "step-1"
    assert not glob.glob(os.path.join(full_disk, "step-2", "COMMIT"))
