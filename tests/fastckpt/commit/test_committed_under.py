"""fastckpt.commit.committed_under: the one answer to "which checkpoints under this parent are
committed, newest first, which counter comes next, and how one stops being committed", asked of
a real parent of real records (written by the core's one record writer) — with a damaged one,
one never committed, one whose file is short, and records under the names fastckpt 0.2 used."""
from __future__ import annotations

import os
import shutil
import zlib

import pytest

from fastckpt.commit import record
from fastckpt.commit.committed_under import CommittedUnder
from fastckpt.commit_info import CommitInfo, FileEntry
from fastckpt.errors import CorruptCheckpointError

NAME = record.COMMIT_NAME


def committed(parent, child: str, counter: int, payload: bytes = b"x" * 100, name: str = NAME) -> None:
    folder = os.path.join(parent, child)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "data.bin"), "wb") as f:
        f.write(payload)
    files = (FileEntry(name="data.bin", rank=0, bytes=len(payload), crc32=zlib.crc32(payload)),)
    record.write(CommitInfo(step=counter * 10, path=folder, bytes=len(payload), counter=counter, time=0.0,
                            world_size=1, format="torch", files=files, meta={}), name)


def test_newest_first_passes_over_what_is_not_committed_and_says_why(tmp_path):
    for child, counter in (("a", 1), ("b", 3), ("c", 2), ("short", 4), ("damaged", 5)):
        committed(tmp_path, child, counter)
    os.makedirs(tmp_path / "never")  # no record: not a checkpoint, quietly
    with open(tmp_path / "short" / "data.bin", "r+b") as f:
        f.truncate(10)
    with open(tmp_path / "damaged" / NAME, "r+b") as f:
        f.seek(5)
        f.write(b"\0\0")
    problems = []
    found = CommittedUnder(tmp_path).newest_first(problems)
    assert [os.path.basename(i.path) for i in found] == ["b", "c", "a"]
    assert len(problems) == 2 and any("short" in p for p in problems) and any("damaged" in p for p in problems)
    assert os.path.basename(CommittedUnder(tmp_path).newest().path) == "b"
    # the next counter skips every record it can read, whatever its files: 4 (short) is taken
    assert CommittedUnder(tmp_path).next_counter() == 5
    assert CommittedUnder(tmp_path, children=lambda n: n in ("a", "c")).next_counter() == 3


def test_an_empty_or_missing_parent_has_none(tmp_path):
    assert CommittedUnder(tmp_path / "nowhere").newest_first() == []
    assert CommittedUnder(tmp_path).newest() is None and CommittedUnder(tmp_path).next_counter() == 1


def test_records_in_formats_no_release_wrote_count_for_nothing_and_a_new_commit_supersedes_them(tmp_path):
    """Today's record under the name fastckpt 0.1 gave a DeepSpeed tag's (0.1 wrote its own
    format there, read by deepspeed_fastckpt.tag_records), or under the name only development
    builds gave a DCP checkpoint's, makes nothing committed; a folder committed again writes
    `COMMIT` and the earlier record is gone."""
    committed(tmp_path, "tag", 1, name=record.EARLIER_NAMES[0])
    committed(tmp_path, "dcp", 2, name="fastckpt-dcp.json")
    committed(tmp_path, "ok", 4)
    assert [os.path.basename(i.path) for i in CommittedUnder(tmp_path).newest_first()] == ["ok"]
    assert record.present(str(tmp_path / "tag")) == "fastckpt-tag.json"
    with pytest.raises(CorruptCheckpointError, match="the name fastckpt 0.1 used"):
        record.read(str(tmp_path / "tag"))
    committed(tmp_path, "tag", 5)  # saved into again by this version
    assert sorted(os.listdir(tmp_path / "tag")) == [NAME, "data.bin"]
    assert [(os.path.basename(i.path), i.counter) for i in CommittedUnder(tmp_path).newest_first()] == [
        ("tag", 5), ("ok", 4)]


def test_withdraw_removes_every_record_name_and_leaves_the_files(tmp_path):
    committed(tmp_path, "a", 1)
    committed(tmp_path, "b", 2)
    committed(tmp_path, "old", 3, name=record.EARLIER_NAMES[0])
    shutil.copy(tmp_path / "a" / NAME, tmp_path / "old" / NAME)  # both names, as a crash mid-upgrade could leave
    under = CommittedUnder(tmp_path)
    under.withdraw(tmp_path / "old")
    under.withdraw(tmp_path / "b")
    under.withdraw(tmp_path / "missing")  # nothing there: nothing to do
    assert os.listdir(tmp_path / "old") == ["data.bin"] and os.listdir(tmp_path / "b") == ["data.bin"]
    assert [os.path.basename(i.path) for i in under.newest_first()] == ["a"]
    assert under.next_counter() == 2  # a withdrawn checkpoint's counter is no longer held
