"""The commit record: the one small file whose durable presence makes a checkpoint real.

Owns its JSON encoding with a CRC-32 over its own canonical bytes, the one function that
writes a record (`write`: every kind of checkpoint commits through it — a Checkpointer's step, a
per-rank folder, a set of files such as a DeepSpeed tag or a DCP checkpoint — as `COMMIT` in the
checkpoint's folder; a file uploaded to an object store has its record beside it; an object
store's checkpoint has its record written once as an object, `write_with` its PUT, and read back
through `parse`), which name a
folder's record has (`present`, `name_in`: `COMMIT`, or `fastckpt-tag.json`, the name fastckpt
0.1 gave a DeepSpeed tag's record: found, and withdrawn with the folder, but `read` refuses it;
deepspeed_fastckpt.tag_records reads 0.1's format), and the checks that a record and the files
it names are intact (sizes; full CRCs are the loader's job). What callers see of a committed checkpoint, CommitInfo, is
fastckpt.commit_info's.
"""
from __future__ import annotations

import json
import os
import zlib
from typing import Callable, Optional

from ..commit_info import CommitInfo, FileEntry
from ..errors import CorruptCheckpointError
from ..fsutil import fsync_dir, read_regular, write_atomic

COMMIT_NAME = "COMMIT"  # the commit record of every checkpoint folder, whatever wrote it
# what fastckpt 0.1, the released version before, named the record of a DeepSpeed tag: read,
# never written (deepspeed_fastckpt.tag_records reads 0.1's own format under it)
EARLIER_NAMES = ("fastckpt-tag.json",)
NAMES = (COMMIT_NAME,) + EARLIER_NAMES
VERSION = 1
MAX_RECORD = 64 << 20


def encode(info: CommitInfo) -> bytes:
    body = {"version": VERSION, "step": info.step, "counter": info.counter, "time": info.time,
            "world_size": info.world_size, "format": info.format, "bytes": info.bytes,
            "meta": info.meta,
            "files": [dict({"name": f.name, "rank": f.rank, "bytes": f.bytes, "crc32": f.crc32,
                            "records": f.records, "spans": f.spans}, **({"etag": f.etag} if f.etag else {}))
                      for f in info.files]}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return json.dumps({"crc32": zlib.crc32(canon.encode()), "body": body}, sort_keys=True,
                      separators=(",", ":")).encode()


def decode(raw: bytes, path: str) -> CommitInfo:
    try:
        outer = json.loads(raw)
        body = outer["body"]
        canon = json.dumps(body, sort_keys=True, separators=(",", ":"))
        if zlib.crc32(canon.encode()) != outer["crc32"]:
            raise CorruptCheckpointError(f"commit record {path} is damaged (CRC mismatch)")
        if body["version"] != VERSION:
            raise CorruptCheckpointError(f"commit record {path} has unknown version {body['version']}")
        files = tuple(FileEntry(plain_name(f["name"], path), int(f["rank"]), int(f["bytes"]), int(f["crc32"]),
                                f.get("spans", []), f.get("records", []), str(f.get("etag", ""))) for f in body["files"])
        if len({f.name for f in files}) != len(files):
            raise CorruptCheckpointError(f"commit record {path} names one file for two ranks")
        return CommitInfo(step=int(body["step"]), path=os.path.dirname(path), bytes=int(body["bytes"]),
                          counter=int(body["counter"]), time=float(body["time"]),
                          world_size=int(body["world_size"]), format=str(body["format"]), files=files,
                          meta=body.get("meta", {}))
    except CorruptCheckpointError:
        raise
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, OverflowError, RecursionError) as e:
        raise CorruptCheckpointError(f"commit record {path} is damaged ({type(e).__name__}: {e})") from None


def plain_name(name, path: str) -> str:
    """A file of the checkpoint's own directory: no separators, no '..', nothing absolute."""
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise CorruptCheckpointError(f"commit record {path} names {name!r}, which is not a file of its directory")
    return name


def name_in(names) -> Optional[str]:
    """The record name among a folder's entries (`COMMIT` before an earlier name); None: none."""
    return next((n for n in NAMES if n in names), None)


def present(folder: str) -> Optional[str]:
    """The name of the commit record in folder (`COMMIT` before an earlier name); None: none."""
    return next((n for n in NAMES if os.path.exists(os.path.join(folder, n))), None)


def write(info: CommitInfo, name: str = COMMIT_NAME, fs=None) -> None:
    """Commits info: its record, atomically and durably, at `info.path/name` (name: `COMMIT`;
    a file's record beside it in an object store is named after the file) (the files it
    names must be durable already; their names and the folder's own are made durable here,
    first: a record never lands without them). The only writer of commit records. fs: an
    fsspec filesystem (an object store: no rename, so the record is simply put last, after the data)."""
    if fs is None:
        fsync_dir(info.path)
        fsync_dir(os.path.dirname(os.path.abspath(info.path)))
        write_atomic(os.path.join(info.path, name), encode(info))
        if name == COMMIT_NAME:
            _drop_earlier(info.path)
    else:
        fs.pipe_file(f"{info.path}/{name}", encode(info))


def write_with(info: CommitInfo, put: Callable[[bytes], object]) -> None:
    """Commits info where no file is written (an object store): put(the record's bytes) writes it
    (once, after every object it names is complete: the caller's PUT with If-None-Match: *)."""
    put(encode(info))


def _drop_earlier(folder: str) -> None:
    """A record under an earlier name in a folder just committed as `COMMIT` (a DeepSpeed tag of
    fastckpt 0.1 saved into again) is superseded: removed, durably."""
    dropped = False
    for name in EARLIER_NAMES:
        try:
            os.unlink(os.path.join(folder, name))
            dropped = True
        except FileNotFoundError:
            continue
    if dropped:
        fsync_dir(folder)


def file_size(path: str) -> Optional[int]:
    """A file's size; None when there is no such file."""
    try:
        return os.path.getsize(path) if os.path.isfile(path) else None
    except OSError:
        return None


def read(ckpt_dir: str, name: Optional[str] = None, size_of: Optional[Callable[[str], Optional[int]]] = file_size,
         every_rank: bool = True) -> CommitInfo:
    """The commit record of ckpt_dir (name: the one there, `present`; FileNotFoundError when
    there is none), with its files' presence and sizes checked
    (size_of: a file's size, None when missing; a pool-backed set's files are pointers whose
    size is the pool version's; size_of=None: the record alone, no file looked at). every_rank: each rank wrote one file at least (the
    Checkpointer's checkpoints); a set of files may have ranks that wrote none. A record under
    an earlier name is 0.1's own format, not this one: CorruptCheckpointError here (the reader of
    what wrote it, deepspeed_fastckpt.tag_records, reads it)."""
    name = name or present(ckpt_dir) or COMMIT_NAME
    path = os.path.join(ckpt_dir, name)
    if name in EARLIER_NAMES:
        raise CorruptCheckpointError(f"{path}: a record under the name fastckpt 0.1 used, "
                                     "not read as a commit record")
    return parse(read_regular(path, MAX_RECORD + 1), path, size_of, every_rank)


def parse(raw: bytes, path: str, size_of: Optional[Callable[[str], Optional[int]]] = None,
          every_rank: bool = True) -> CommitInfo:
    """A record's bytes, read from path (a file, or an object's URL), checked as read() says."""
    ckpt_dir = os.path.dirname(path)
    if len(raw) > MAX_RECORD:
        raise CorruptCheckpointError(f"commit record {path} is larger than {MAX_RECORD >> 20} MiB")
    info = decode(raw, path)
    ranks = {f.rank for f in info.files}
    if (every_rank and len(ranks) != info.world_size) or not ranks <= set(range(info.world_size)):
        raise CorruptCheckpointError(f"{path}: names files of ranks {sorted(ranks)} for {info.world_size} ranks")
    if size_of is not None:
        check_files(info, ckpt_dir, size_of)
    return info


def check_files(info: CommitInfo, ckpt_dir: str, size_of: Callable[[str], Optional[int]] = file_size) -> None:
    """Every file the record names is in ckpt_dir with the size it says; CorruptCheckpointError if not."""
    for f in info.files:
        size = size_of(os.path.join(ckpt_dir, f.name))
        if size is None:
            raise CorruptCheckpointError(f"{ckpt_dir}: file {f.name} named by the commit record is missing")
        if size != f.bytes:
            raise CorruptCheckpointError(
                f"{ckpt_dir}: file {f.name} has {size} bytes, the commit record says {f.bytes} (truncated?)")
