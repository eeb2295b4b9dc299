"""A committed folder of a bucket (fastckpt.store.s3.folder_mirror's: a DeepSpeed tag) fetched back
into its local parent on every rank, at one call: a folder as the framework wrote it, committed.

Three steps, each agreed by every rank before the next (one rank's failure is every rank's): an older
folder of that name on this rank's disk is moved aside whole (a newer committed one is never replaced:
the fetch fails instead); each rank downloads its share of the objects (on a disk the ranks share, the
work is split); each rank downloads whatever its own disk still lacks (on a disk of its own), then
writes the folder's record. Every object is downloaded beside its name, checked against every CRC
its record holds, made durable and renamed into place: a damaged object never lands, and a
CorruptCheckpointError names it by its URL.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import uuid
from typing import Callable, Optional

from ...commit import record as commit
from ...commit.agreement import Agreement
from ...commit_info import CommitInfo, FileEntry
from ...errors import CorruptCheckpointError
from ...fsutil import fsync_dir
from ...machine import read_threads
from ...verify import verify_file
from .client import GET_BYTES, Bucket
from .place import S3Place


def fetch_folder(bucket: Bucket, where: S3Place, agree: Agreement, info: CommitInfo, parent: str) -> str:
    """The bucket's folder `info` (its record, as listed under `where`) made the committed folder
    parent/NAME on every rank; its local path. Every rank or none: CorruptCheckpointError naming what
    failed (an object missing or damaged: its URL; a newer folder of that name committed here)."""
    name = os.path.basename(info.path)
    folder = os.path.join(parent, name)

    def step(work: Callable[[], None]) -> None:
        why = ""
        try:
            work()
        except (OSError, CorruptCheckpointError) as e:
            why = str(e)
        if not agree.all_ok(not why):
            raise CorruptCheckpointError(why or f"{info.path} could not be fetched on another rank; "
                                                "see its error there")

    def clear() -> None:  # an older folder of the same name, on this node's disk: moved away whole
        here = _counter_of(folder)
        if here is not None and here > info.counter:
            raise CorruptCheckpointError(f"{folder} holds a newer committed {name!r} than {info.path}: "
                                         "not replaced by the bucket's")
        if here == info.counter and all(holds_file(folder, f) for f in info.files):
            return
        aside = os.path.join(parent, f".{name}.fastckpt-stale-{uuid.uuid4().hex}")
        try:
            os.rename(folder, aside)
        except FileNotFoundError:
            return
        shutil.rmtree(aside, ignore_errors=True)

    def share() -> None:  # on a shared disk each rank fetches its share
        os.makedirs(folder, exist_ok=True)
        for i, entry in enumerate(info.files):
            if i % agree.world_size == agree.rank and not holds_file(folder, entry):
                _download(bucket, where, info, entry, folder)

    def rest() -> None:  # on a disk of its own a rank fetches what the others put elsewhere
        for entry in info.files:
            if not holds_file(folder, entry):
                _download(bucket, where, info, entry, folder)
        fsync_dir(folder)
        commit.write(dataclasses.replace(info, path=folder))

    os.makedirs(parent, exist_ok=True)
    step(clear)
    step(share)
    step(rest)
    return folder


def _download(bucket: Bucket, where: S3Place, info: CommitInfo, entry: FileEntry, folder: str) -> None:
    """One object into folder: downloaded beside its name, every CRC checked, made durable,
    renamed into place; CorruptCheckpointError names the object."""
    url = f"{info.path}/{entry.name}"
    tmp = os.path.join(folder, f".{entry.name}.fastckpt-fetch-{os.getpid()}.tmp")
    try:
        bucket.download(where.key_of(url), tmp, entry.bytes, GET_BYTES, read_threads())
        try:
            verify_file(tmp, entry)
        except CorruptCheckpointError as e:
            raise CorruptCheckpointError(str(e).replace(tmp, url)) from None
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, os.path.join(folder, entry.name))
    except FileNotFoundError as e:
        raise CorruptCheckpointError(f"{url}: missing from the bucket ({e})") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def holds_file(folder: str, entry: FileEntry) -> bool:
    """folder holds entry's file with its size."""
    return commit.file_size(os.path.join(folder, entry.name)) == entry.bytes


def _counter_of(folder: str) -> Optional[int]:
    """The counter of folder's commit record (None: no readable record)."""
    try:
        return commit.read(folder, None, size_of=None, every_rank=False).counter
    except (OSError, CorruptCheckpointError):
        return None
