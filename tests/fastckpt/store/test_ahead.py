"""Files made ahead (fastckpt/store/ahead.py): the root store makes each rank's next file once a
checkpoint landed, the next save takes it, and nothing about what is committed changes.

Real Checkpointers over real directories; the commit threads are joined (what close() does)
before a file made ahead is looked at, so nothing here waits on a clock.
"""
from __future__ import annotations

import errno
import os
import shutil

import pytest
import torch

from fastckpt import Checkpointer
from fastckpt.store import ahead


def state(step: int, n: int = 300_000) -> dict:
    return {"step": step, "w": torch.arange(n, dtype=torch.float32) + step, "b": torch.full((977,), float(step))}


def settled(ck: Checkpointer) -> None:
    """Every checkpoint landed and every commit thread ended (retention, the file made ahead)."""
    ck.wait()
    ck._commits.join()


def made_ahead(root) -> str:
    return ahead.path_of(str(root), "rank-0.pt")


def zeros_only(path: str) -> bool:
    with open(path, "rb") as f:
        data = f.read()
    return data.count(0) == len(data)


@pytest.mark.parametrize("strategy", ["c", "d"])
def test_the_next_file_is_made_ahead_and_the_next_save_writes_into_it(tmp_path, strategy):
    ck = Checkpointer(tmp_path, strategy=strategy, keep=1)
    ck.save(state(1), step=1)
    settled(ck)
    nxt = made_ahead(tmp_path)
    assert os.path.exists(nxt)
    inode = os.stat(nxt).st_ino
    info = ck.save(state(2), step=2).wait()
    assert os.stat(info.file_for(0)).st_ino == inode  # taken: no file was created for step 2
    settled(ck)
    got = ck.load()
    assert got["step"] == 2 and torch.equal(got["w"], state(2)["w"]) and torch.equal(got["b"], state(2)["b"])
    ck.store.verify(ck.store.committed()[0])  # every CRC, the file's own included
    assert os.path.getsize(info.file_for(0)) == info.files[0].bytes
    ck.close()


def test_a_file_made_ahead_is_new_never_an_old_checkpoints(tmp_path):
    """Never written: a load may have mapped a removed checkpoint's file, and writing over it
    would change the tensors that load handed out."""
    ck = Checkpointer(tmp_path, strategy="c", keep=1)
    for step in range(1, 5):
        ck.save(state(step), step=step)
        settled(ck)
        assert zeros_only(made_ahead(tmp_path)), f"after step {step} the file made ahead holds written bytes"
    ck.close()


def test_a_file_made_ahead_of_another_size_is_cut_or_grown_to_the_save(tmp_path):
    ck = Checkpointer(tmp_path, strategy="c", keep=2)
    for step, n in ((1, 1000), (2, 400_000), (3, 1000)):  # grows (a small file ahead), then shrinks
        info = ck.save(state(step, n), step=step).wait()
        assert os.path.getsize(info.file_for(0)) == info.files[0].bytes
        settled(ck)
        got = ck.load()
        assert got["step"] == step and torch.equal(got["w"], state(step, n)["w"])
        ck.store.verify(ck.store.committed()[0])
    ck.close()


def test_close_removes_the_files_it_made_ahead(tmp_path):
    ck = Checkpointer(tmp_path, strategy="c", keep=1)
    ck.save(state(1), step=1)
    settled(ck)
    assert os.path.exists(made_ahead(tmp_path))
    ck.close()
    assert not os.path.exists(os.path.join(tmp_path, ahead.FOLDER))
    assert Checkpointer(tmp_path).load()["step"] == 1


def test_writing_starts_by_removing_what_a_crash_left_ahead(tmp_path):
    """A process killed while it made a file ahead leaves it, or its temporary, behind: the next
    writer removes both before its first save and makes its own."""
    folder = os.path.join(tmp_path, ahead.FOLDER)
    os.makedirs(folder)
    left = [made_ahead(tmp_path), os.path.join(folder, "rank-0.pt.4242.1.tmp")]
    for path in left:
        with open(path, "wb") as f:
            f.write(b"\x7f" * 5000)
    ck = Checkpointer(tmp_path, strategy="c", keep=1)
    ck.save(state(1), step=1).wait()
    assert not os.path.exists(left[1])
    settled(ck)
    assert zeros_only(made_ahead(tmp_path))
    assert ck.load()["step"] == 1
    ck.close()


def test_no_room_for_a_file_ahead_leaves_none_and_the_next_save_creates_its_own(tmp_path, monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ahead.os, "posix_fallocate", full)  # the preallocation of the file ahead only
    assert not ahead.make(str(tmp_path), "rank-0.pt", 1 << 20)
    assert not os.listdir(os.path.join(tmp_path, ahead.FOLDER))  # no temporary left either
    monkeypatch.undo()
    ck = Checkpointer(tmp_path, strategy="c", keep=1)
    ck.save(state(1), step=1).wait()
    assert ck.load()["step"] == 1
    ck.close()


def test_none_is_made_on_a_memory_filesystem_or_by_a_memory_tier(tmp_path):
    shm = "/dev/shm"
    if not os.path.isdir(shm) or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm")
    root = os.path.join(shm, f"fastckpt-ahead-{os.getpid()}")
    try:
        ck = Checkpointer(root, strategy="c", keep=1)
        ck.save(state(1), step=1)
        settled(ck)
        assert not os.path.exists(os.path.join(root, ahead.FOLDER))
        ck.close()
        tier = os.path.join(shm, f"fastckpt-ahead-tier-{os.getpid()}")
        ck = Checkpointer(tiers=[tier, str(tmp_path)], strategy="c", keep=1)
        ck.save(state(1), step=1)
        settled(ck)
        assert not os.path.exists(os.path.join(tier, "rank-0", ahead.FOLDER))
        ck.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(os.path.join(shm, f"fastckpt-ahead-tier-{os.getpid()}"), ignore_errors=True)


def test_a_link_left_where_a_file_made_ahead_goes_is_never_written_through(tmp_path):
    """A symbolic link at .ahead/rank-0.pt (not a file this process made) is not taken: the save
    creates its own file, and what the link names is untouched."""
    ck = Checkpointer(tmp_path / "root", strategy="c", keep=1)
    ck.save(state(1), step=1)
    settled(ck)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    os.unlink(made_ahead(tmp_path / "root"))
    os.symlink(victim, made_ahead(tmp_path / "root"))
    info = ck.save(state(2), step=2).wait()
    assert victim.read_bytes() == b"keep me"
    assert not os.path.islink(info.file_for(0))
    assert ck.load()["step"] == 2
    ck.close()
