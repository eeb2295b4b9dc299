"""fastckpt.commit.file_sets: a set of files (several per rank) commits with one record, written
by the one record writer only once every file is durable, with each file's rank, size and CRC-32;
counters go on across reopenings; a failed file leaves no record and the previous set intact;
a withdrawn owner is deleted once its sets land and none of them is committed. Real saves
(NamedCheckpoints over the path store) make the files."""
from __future__ import annotations

import os
import threading

import pytest
import torch

from fastckpt.commit import record as commit
from fastckpt.commit.agreement import Agreement
from fastckpt.commit.file_sets import FileSets
from fastckpt.errors import CheckpointWriteError, CorruptCheckpointError
from fastckpt.named import NamedCheckpoints
from fastckpt.pending import Pending
from fastckpt.write.deadline import Deadline

RECORD = commit.COMMIT_NAME


def sets(after=None, stall_s: float = 60.0) -> FileSets:
    return FileSets(Agreement(), Deadline(stall_s), 0.0, after_record=after)


def save_files(named: NamedCheckpoints, directory, names, step: int) -> list:
    return [(str(directory / n), named.save({"w": torch.full((1000,), float(i + step))}, str(directory / n), step))
            for i, n in enumerate(names)]


def test_a_set_commits_with_one_record_naming_every_file_after_they_are_durable(tmp_path):
    named = NamedCheckpoints.by_path({})
    seen = []

    def after(info):  # the record is there, and every file it names, when the convention's step runs
        seen.append((info, commit.read(info.path, RECORD, every_rank=False)))

    s = sets(after)
    files = save_files(named, tmp_path / "run" / "t1", ["a.pt", "b.pt", "c.pt"], step=7)
    s.submit(str(tmp_path / "run" / "t1"), files, step=7, meta={"tag": "t1"})
    s.wait()
    named.close()
    info = commit.read(str(tmp_path / "run" / "t1"), RECORD, every_rank=False)
    assert [f.name for f in info.files] == ["a.pt", "b.pt", "c.pt"] and {f.rank for f in info.files} == {0}
    assert info.step == 7 and info.counter == 1 and info.meta == {"tag": "t1"} and info.world_size == 1
    for f in info.files:
        loaded = torch.load(tmp_path / "run" / "t1" / f.name, weights_only=True)
        assert os.path.getsize(tmp_path / "run" / "t1" / f.name) == f.bytes and loaded["w"].numel() == 1000
        assert f.spans  # chunk CRCs travel into the set's record: verify can name a bad chunk
    assert len(seen) == 1 and seen[0][1] == seen[0][0]


def test_counters_go_on_under_the_same_parent_across_reopenings(tmp_path):
    named = NamedCheckpoints.by_path({})
    for n in range(2):
        s = sets()
        s.submit(str(tmp_path / f"t{n}"), save_files(named, tmp_path / f"t{n}", ["x.pt"], n), step=n)
        s.wait()
    named.close()
    counters = [commit.read(str(tmp_path / f"t{n}"), RECORD, every_rank=False).counter for n in range(2)]
    assert counters == [1, 2]


def test_a_failed_file_leaves_no_record_and_the_previous_set_intact(tmp_path):
    named = NamedCheckpoints.by_path({})
    s = sets()
    s.submit(str(tmp_path / "t1"), save_files(named, tmp_path / "t1", ["x.pt"], 1), step=1)
    s.wait()
    broken = Pending(2, 5)
    broken.settle(None, OSError("disk gone"))
    s.submit(str(tmp_path / "t2"), save_files(named, tmp_path / "t2", ["x.pt"], 2) + [(str(tmp_path / "t2" / "y.pt"),
                                                                                     broken)], step=2)
    with pytest.raises(CheckpointWriteError, match="disk gone"):
        s.wait()
    named.close()
    assert not (tmp_path / "t2" / RECORD).exists()
    assert commit.read(str(tmp_path / "t1"), RECORD, every_rank=False).step == 1


def test_a_withdrawn_owner_is_deleted_once_its_sets_land_and_nothing_of_it_is_committed(tmp_path):
    held = Pending(1, 1)  # a file still being written: the set cannot land before it does
    s = sets()
    owner = tmp_path / "epoch=0.ckpt"
    (owner / "checkpoint").mkdir(parents=True)
    s.submit(str(owner / "checkpoint"), [(str(owner / "checkpoint" / "x.pt"), held)], step=1)
    assert s.withdraw(str(owner)) and s.is_withdrawn(str(owner))
    assert not s.withdraw(str(tmp_path / "other"))  # nothing in flight there: the caller deletes it
    done = threading.Event()
    threading.Thread(target=lambda: (s.wait_for(str(owner)), done.set()), daemon=True).start()
    assert not done.wait(0.3)
    held.settle(None, OSError("removed under it"))  # its failure is no error: its owner is gone
    assert done.wait(30)
    s.wait()
    assert not owner.exists()


def test_a_record_with_a_file_of_the_wrong_size_or_a_rank_out_of_range_is_not_committed(tmp_path):
    named = NamedCheckpoints.by_path({})
    s = sets()
    s.submit(str(tmp_path / "t"), save_files(named, tmp_path / "t", ["x.pt"], 1), step=1)
    s.wait()
    named.close()
    info = commit.read(str(tmp_path / "t"), RECORD, every_rank=False)
    with open(tmp_path / "t" / "x.pt", "ab") as f:
        f.write(b"\0")
    with pytest.raises(CorruptCheckpointError, match="bytes"):
        commit.read(str(tmp_path / "t"), RECORD, every_rank=False)
    bad = commit.CommitInfo(step=1, path=str(tmp_path / "t"), bytes=1, counter=9, time=0.0, world_size=1,
                            format="torch", files=(commit.FileEntry("x.pt", 3, info.files[0].bytes + 1, 0),))
    commit.write(bad, RECORD)
    with pytest.raises(CorruptCheckpointError, match="ranks"):
        commit.read(str(tmp_path / "t"), RECORD, every_rank=False)
