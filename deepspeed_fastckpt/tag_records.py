"""DeepSpeed's tag folders on disk: the commit record fastckpt writes into a tag, the
mark it leaves first, and what a tag folder holds.

A DeepSpeed tag (`save_dir/tag/`) is several files per rank (model states, ZeRO optimizer
partitions). fastckpt's DeepSpeed engine commits a tag as one set of files across ranks
(fastckpt.commit.file_sets): once every rank's files are durable, rank 0 writes the tag's
commit record `save_dir/tag/COMMIT` (fastckpt.commit.record's, as every fastckpt checkpoint's:
every file with its rank, size and CRC-32, and a counter) and `save_dir/fastckpt-latest`, both
atomically. The record fastckpt 0.1 wrote (`fastckpt-tag.json`: plain JSON with a sequence
number) still reads. DeepSpeed's own
`latest` file is written with a plain open() and may be missing, torn, or name a tag that
never completed; `newest_committed_tag` ignores it.

Before any file of a tag is written, `mark_open` leaves `save_dir/tag/fastckpt-tag.open`: a
tag with that mark and no record is one fastckpt began and never committed. Files fastckpt
wrote can also arrive in a tag it never saved (ds_to_universal copies the model-state files
into its universal tag); without the mark they are another writer's checkpoint. The mark is
durable before the tag's first file is written.

A tag is (tag_status)
  committed  the record is there and every file it names has its size;
  torn       fastckpt began it (its open mark, a writer's hidden file) and never committed it;
  damaged    its record is unreadable or disagrees with the files;
  foreign    checkpoint files another engine wrote or put there, with no record to check;
  empty      a directory without checkpoint files (a save cut short before any file);
  missing    no such directory.
The engine and the `fastckpt` command (through deepspeed_fastckpt.folders) read tags through here.
"""
from __future__ import annotations

import json
import os
from typing import Callable, Optional

from fastckpt.errors import CorruptCheckpointError
from fastckpt.session import (CommitInfo, CommittedUnder, FileEntry, file_size, fsync_dir, is_pool_pointer,
                              makedirs_durable, read_regular, write_atomic)
from fastckpt.session import record as commit

SizeOf = Callable[[str], Optional[int]]

EARLIER_RECORD = "fastckpt-tag.json"  # a tag's record as fastckpt 0.1 named it (fastckpt.commit.record.NAMES)
TAG_OPEN = "fastckpt-tag.open"
LATEST = "fastckpt-latest"


def read_record(save_dir: str, tag: str, size_of: Optional[SizeOf] = file_size) -> CommitInfo:
    """The commit record of a tag (fastckpt.commit.record's, or a 0.1 tag record), checked
    against the files it names (size_of: a file's size, or of the pool version saved under that
    path; None: the record alone); CorruptCheckpointError if not."""
    tag_dir = os.path.join(save_dir, tag)
    try:
        return commit.read(tag_dir, None, size_of, every_rank=False)
    except FileNotFoundError:
        raise CorruptCheckpointError(f"tag {tag!r} in {save_dir} was never committed "
                                     "(no commit record): its files may be incomplete") from None
    except OSError as e:  # unreadable (permissions, not a regular file): damaged, never loaded
        raise CorruptCheckpointError(f"{tag_dir}: damaged commit record ({e})") from None
    except CorruptCheckpointError:
        info = _record_of_0_1(tag_dir)
        if info is None:
            raise
    if size_of is not None:
        commit.check_files(info, tag_dir, size_of)
    return info


def _record_of_0_1(tag_dir: str) -> Optional[CommitInfo]:
    """A tag record as fastckpt 0.1 wrote it (plain JSON: tag, seq, world_size, files with
    name, bytes and hex CRC-32; no CRC of its own, no ranks); None when it is not one."""
    path = os.path.join(tag_dir, EARLIER_RECORD)
    try:
        rec = json.loads(read_regular(path, commit.MAX_RECORD))
        if not isinstance(rec, dict) or "body" in rec:
            return None
        files = tuple(FileEntry(commit.plain_name(f["name"], path), 0, int(f["bytes"]), int(f["crc32"], 16))
                      for f in rec["files"])
        return CommitInfo(step=-1, path=tag_dir, bytes=sum(f.bytes for f in files), counter=int(rec["seq"]),
                          time=os.path.getmtime(path), world_size=int(rec.get("world_size", 0)) or 1,
                          format="torch", files=files, meta={"tag": rec.get("tag")})
    except (OSError, ValueError, KeyError, TypeError, RecursionError, CorruptCheckpointError):
        return None


def write_latest(save_dir: str, tag: str) -> None:
    """Once a tag is committed (rank 0): `fastckpt-latest` names it."""
    write_atomic(os.path.join(save_dir, LATEST), tag.encode())


def name_in_deepspeeds_latest(save_dir: str, tag: str, counter: int) -> None:
    """Once a tag is committed (rank 0, after write_latest): DeepSpeed's own `latest` names it,
    written atomically and durably — DeepSpeed writes it in place with a plain open(), which a
    power loss can leave naming an older tag (a resume would go back past a committed one) or
    torn. Left alone when it names a newer committed tag."""
    named = read_latest(save_dir, "latest")
    if named is not None and named != tag:
        try:
            if read_record(save_dir, named, size_of=None).counter > counter:
                return
        except CorruptCheckpointError:
            pass  # not a committed tag (one in flight, or not a tag at all): this one is newer
    write_atomic(os.path.join(save_dir, "latest"), tag.encode())


def mark_open(save_dir: str, tag: str) -> None:
    """Marks `save_dir/tag` as a tag fastckpt is saving (every rank may; it stays after the
    commit), durably before it returns: POSIX orders no two names, so a power loss before the
    directory sync that follows a file's rename could keep that file and lose a mark not yet
    synced, leaving a torn tag that reads as another writer's (foreign) and loads."""
    tag_dir = os.path.join(save_dir, str(tag))
    makedirs_durable(save_dir)
    os.makedirs(tag_dir, exist_ok=True)
    os.close(os.open(os.path.join(tag_dir, TAG_OPEN), os.O_WRONLY | os.O_CREAT, 0o644))
    fsync_dir(tag_dir)  # the mark (one journal commit with the folder's own name, where there is a journal)
    fsync_dir(save_dir)  # the tag folder's name


def tags_under(save_dir: str, size_of: Optional[SizeOf] = file_size) -> CommittedUnder:
    """save_dir's tags as the core's committed checkpoints under a parent (read_record reads each:
    0.1's tag records too)."""
    return CommittedUnder(save_dir, size_of=size_of,
                          read=lambda folder, size: read_record(save_dir, os.path.basename(folder), size))


def newest_committed_tag(save_dir: str, size_of: SizeOf = file_size) -> Optional[str]:
    """The committed tag with the highest counter (None if there is none)."""
    newest = tags_under(save_dir, size_of).newest()
    return None if newest is None else os.path.basename(newest.path)


def newest_counter(save_dir: str) -> int:
    """The highest counter of any tag record in save_dir, its files unchecked (0: none)."""
    return tags_under(save_dir).next_counter() - 1


def files_of(tag_dir: str) -> tuple[bool, bool]:
    """(fastckpt began this tag, another writer's checkpoint files are there). Ours: the mark
    a fastckpt save leaves first, a writer's hidden temporary file, a pool pointer. A file
    carrying fastckpt's CRC in a tag without the mark was put there by someone else (a copy)."""
    try:
        names = os.listdir(tag_dir)
    except OSError:
        return False, False
    ours = foreign = False
    for name in names:
        path = os.path.join(tag_dir, name)
        if name == TAG_OPEN or (".fastckpt-" in name and name.endswith(".tmp")):
            ours = True
        elif name not in commit.NAMES and os.path.isfile(path) and not os.path.islink(path):
            if is_pool_pointer(path):
                ours = True
            elif name.endswith(".pt"):
                foreign = True
    return ours, foreign


def tag_status(save_dir: str, tag: str, size_of: SizeOf) -> tuple[str, str]:
    """(committed | torn | damaged | foreign | empty | missing, why)."""
    tag_dir = os.path.join(save_dir, tag)
    if not tag or os.path.basename(os.path.normpath(tag)) != os.path.normpath(tag) or not os.path.isdir(tag_dir):
        return "missing", f"there is no tag {tag!r} in {save_dir}"
    if commit.present(tag_dir) is not None:
        try:
            read_record(save_dir, tag, size_of)
            return "committed", ""
        except CorruptCheckpointError as e:
            return "damaged", str(e)
    ours, foreign = files_of(tag_dir)
    if ours:
        return "torn", (f"tag {tag!r} in {save_dir} was never committed (no commit record): fastckpt's save of it "
                        "did not complete")
    if not foreign:
        return "empty", f"tag {tag!r} in {save_dir} holds no checkpoint file (a save cut short?)"
    return "foreign", (f"tag {tag!r} in {save_dir} has no fastckpt commit record: it was written by another "
                       "checkpoint engine, so it is loaded as DeepSpeed would load it, without fastckpt's checks")


def read_latest(save_dir: str, latest_file: str) -> Optional[str]:
    """The tag DeepSpeed's `latest` file names (None: no file, or not a tag name)."""
    try:
        raw = read_regular(os.path.join(save_dir, latest_file), 4096).decode().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return raw or None
