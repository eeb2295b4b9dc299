"""DeepSpeed-style tag folders on disk: the commit record fastckpt writes into a tag, the
mark it leaves first, and what a tag folder holds.

A DeepSpeed tag (`save_dir/tag/`) is several files per rank (model states, ZeRO optimizer
partitions). fastckpt's DeepSpeed engine commits a tag once every rank's files are durable:
rank 0 then writes `save_dir/tag/fastckpt-tag.json` (every file with its size and CRC-32,
and a sequence number) and `save_dir/fastckpt-latest`, both atomically. DeepSpeed's own
`latest` file is written with a plain open() and may be missing, torn, or name a tag that
never completed; `newest_committed` ignores it.

Before any file of a tag is written, `mark_open` leaves `save_dir/tag/fastckpt-tag.open`: a
tag with that mark and no record is one fastckpt began and never committed. Files fastckpt
wrote can also arrive in a tag it never saved (ds_to_universal copies the model-state files
into its universal tag); without the mark they are another writer's checkpoint. The mark's
directory entry is made durable by the directory sync that follows the first file's rename.

A tag is (tag_status)
  committed  the record is there and every file it names has its size;
  torn       fastckpt began it (its open mark, a writer's hidden file) and never committed it;
  damaged    its record is unreadable or disagrees with the files;
  foreign    checkpoint files another engine wrote or put there, with no record to check;
  empty      a directory without checkpoint files (a save cut short before any file);
  missing    no such directory.
The engine (deepspeed_fastckpt) and the `fastckpt` command both read tags through here.
"""
from __future__ import annotations

import json
import os
from typing import Callable, Optional

from ..errors import CorruptCheckpointError
from ..fsutil import read_regular, write_atomic

SizeOf = Callable[[str], Optional[int]]

TAG_RECORD = "fastckpt-tag.json"
TAG_OPEN = "fastckpt-tag.open"
LATEST = "fastckpt-latest"


def parse_record(save_dir: str, tag: str) -> dict:
    path = os.path.join(save_dir, tag, TAG_RECORD)
    try:
        with open(path, "rb") as f:
            rec = json.loads(f.read())
        return {"tag": tag, "seq": int(rec["seq"]), "files": list(rec["files"]),
                "world_size": int(rec.get("world_size", 0)) or None}
    except FileNotFoundError:
        raise CorruptCheckpointError(f"tag {tag!r} in {save_dir} was never committed "
                                     f"(no {TAG_RECORD}): its files may be incomplete") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CorruptCheckpointError(f"{path}: damaged commit record ({e})") from None


def write_record(save_dir: str, tag: str, seq: int, world_size: int, files: list) -> None:
    """Commits a tag (rank 0, once every rank's files are durable): its record, then `fastckpt-latest`."""
    record = {"tag": tag, "seq": seq, "world_size": world_size, "files": files}
    write_atomic(os.path.join(save_dir, tag, TAG_RECORD), json.dumps(record, indent=1).encode())
    write_atomic(os.path.join(save_dir, LATEST), tag.encode())


def mark_open(save_dir: str, tag: str) -> None:
    """Marks `save_dir/tag` as a tag fastckpt is saving (every rank may; it stays after the commit)."""
    tag_dir = os.path.join(save_dir, str(tag))
    os.makedirs(tag_dir, exist_ok=True)
    os.close(os.open(os.path.join(tag_dir, TAG_OPEN), os.O_WRONLY | os.O_CREAT, 0o644))


def file_size(path: str) -> Optional[int]:
    return os.path.getsize(path) if os.path.isfile(path) else None


def read_record(save_dir: str, tag: str, size_of: Callable[[str], Optional[int]] = file_size) -> dict:
    """The commit record of a tag, checked against the files it names (size_of: a file's size,
    or of the pool version saved under that path); CorruptCheckpointError if not."""
    rec = parse_record(save_dir, tag)
    for f in rec["files"]:
        size = size_of(os.path.join(save_dir, tag, f["name"]))
        if size != f["bytes"]:
            raise CorruptCheckpointError(f"tag {tag!r}: {f['name']} is {size} bytes, its commit record "
                                         f"says {f['bytes']}")
    return rec


def newest_committed(save_dir: str, size_of: Callable[[str], Optional[int]] = file_size) -> Optional[str]:
    """The committed tag with the highest sequence number (None if there is none)."""
    best: Optional[dict] = None
    if not os.path.isdir(save_dir):
        return None
    for tag in os.listdir(save_dir):
        if not os.path.isfile(os.path.join(save_dir, tag, TAG_RECORD)):
            continue
        try:
            rec = read_record(save_dir, tag, size_of)
        except CorruptCheckpointError:
            continue
        if best is None or rec["seq"] > best["seq"]:
            best = rec
    return None if best is None else best["tag"]


def next_seq(save_dir: str) -> int:
    seqs = [0]
    for tag in os.listdir(save_dir) if os.path.isdir(save_dir) else []:
        try:
            seqs.append(parse_record(save_dir, tag)["seq"])
        except CorruptCheckpointError:
            pass
    return max(seqs) + 1


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
        elif name != TAG_RECORD and os.path.isfile(path) and not os.path.islink(path):
            if is_pool_pointer(path):
                ours = True
            elif name.endswith(".pt"):
                foreign = True
    return ours, foreign


def is_pool_pointer(path: str) -> bool:
    """Whether path is the small file a pool-backed engine leaves where a tag's file would be."""
    try:
        body = json.loads(read_regular(path, 4096))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(body, dict) and "fastckpt_pool" in body


def tag_status(save_dir: str, tag: str, size_of: SizeOf) -> tuple[str, str]:
    """(committed | torn | damaged | foreign | empty | missing, why)."""
    tag_dir = os.path.join(save_dir, tag)
    if not tag or os.path.basename(os.path.normpath(tag)) != os.path.normpath(tag) or not os.path.isdir(tag_dir):
        return "missing", f"there is no tag {tag!r} in {save_dir}"
    if os.path.exists(os.path.join(tag_dir, TAG_RECORD)):
        try:
            read_record(save_dir, tag, size_of)
            return "committed", ""
        except CorruptCheckpointError as e:
            return "damaged", str(e)
    ours, foreign = files_of(tag_dir)
    if ours:
        return "torn", (f"tag {tag!r} in {save_dir} was never committed (no {TAG_RECORD}): fastckpt's save of it "
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
