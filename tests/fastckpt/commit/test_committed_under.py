"""fastckpt.commit.committed_under: the one answer to "which checkpoints under this parent are
committed, newest first, and which counter comes next", asked of a real parent of real records
(written by the core's one record writer) — with a damaged one, one never committed, and one
whose file is short."""
from __future__ import annotations

import os
import zlib

from fastckpt.commit import record
from fastckpt.commit.committed_under import CommittedUnder
from fastckpt.commit_info import CommitInfo, FileEntry

NAME = "fastckpt-test.json"


def committed(parent, child: str, counter: int, payload: bytes = b"x" * 100) -> None:
    folder = os.path.join(parent, child)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "data.bin"), "wb") as f:
        f.write(payload)
    files = (FileEntry(name="data.bin", rank=0, bytes=len(payload), crc32=zlib.crc32(payload)),)
    record.write(CommitInfo(step=counter * 10, path=folder, bytes=len(payload), counter=counter, time=0.0,
                            world_size=1, format="torch", files=files, meta={}), NAME)


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
    found = CommittedUnder(tmp_path, NAME).newest_first(problems)
    assert [os.path.basename(i.path) for i in found] == ["b", "c", "a"]
    assert len(problems) == 2 and any("short" in p for p in problems) and any("damaged" in p for p in problems)
    assert os.path.basename(CommittedUnder(tmp_path, NAME).newest().path) == "b"
    # the next counter skips every record it can read, whatever its files: 4 (short) is taken
    assert CommittedUnder(tmp_path, NAME).next_counter() == 5
    assert CommittedUnder(tmp_path, NAME, children=lambda n: n in ("a", "c")).next_counter() == 3


def test_an_empty_or_missing_parent_has_none(tmp_path):
    assert CommittedUnder(tmp_path / "nowhere", NAME).newest_first() == []
    assert CommittedUnder(tmp_path, NAME).newest() is None and CommittedUnder(tmp_path, NAME).next_counter() == 1
