"""DCP checkpoints in an object store: a checkpoint directory that is an s3:// prefix.

FastStorageWriter("s3://bucket/run/step-10") writes each rank's file exactly as into a local
directory, but into its local spool (fastckpt.store.s3.spool), and uploads it once durable, before
the ranks agree that every file landed; the coordinator uploads `.metadata`, then PUTs the one
commit record (`COMMIT`, naming every object with its size, ETag and CRC-32) with If-None-Match: *,
its counter one past the highest of the records beside it. Nothing is renamed: a reader trusts the
prefix only through that record. FastStorageReader("s3://...") reads the record (its objects listed:
each one it names there, of its size and ETag), downloads `.metadata` and the files its rank's plan
reads (parallel ranged GETs) into its spool, and reads them as local files, every CRC checked;
resharding is DCP's planner's, as on a disk. `newest_committed("s3://bucket/run")` lists the records
under the prefix. Saves cut short leave objects without a record and unfinished uploads: each save
removes those of checkpoints older than the newest committed one under the same parent.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from typing import Optional, Union

from ..commit import record
from ..commit_info import CommitInfo
from ..errors import ConfigError, CorruptCheckpointError
from ..settings import local_place
from ..store.s3.checked import committed_under, read_checked
from ..store.s3.client import UPLOAD_CONCURRENCY, bucket_for
from ..store.s3.place import S3Place, is_s3
from ..store.s3.spool import Spool
from . import metadata as md_file
from .names import SUFFIX, step_of_name

__all__ = ["Places", "RemoteCheckpoint", "S3Place", "Spool", "committed_at", "is_s3", "newest_committed_at",
           "withdraw_at"]


class Places:
    """Where a DCP writer's or reader's checkpoints lie on this machine: a path as it is; an s3://
    URL as a folder of a spool of its own, its files uploaded from there or downloaded into it. The
    RemoteCheckpoint of each URL placed is kept, by its local folder, until done() with it."""

    def __init__(self, timeout_s: float = 120.0, endpoint: Optional[str] = None) -> None:
        self._spool = Spool()
        weakref.finalize(self, self._spool.close)  # an owner never closed leaves no folder on /dev/shm
        self._timeout_s, self._endpoint = timeout_s, endpoint
        self._remotes: dict[str, RemoteCheckpoint] = {}

    def place(self, path: Union[str, "os.PathLike[str]"]) -> tuple[str, Optional["RemoteCheckpoint"]]:
        """The local folder of the checkpoint at `path`, and its RemoteCheckpoint (None: a path)."""
        if is_s3(os.fspath(path)):
            remote = RemoteCheckpoint(os.fspath(path), self._spool, self._timeout_s, self._endpoint)
            self._remotes[remote.local] = remote
            return remote.local, remote
        return local_place(path, "the DCP checkpoint"), None

    def done(self, local: str) -> None:
        """The checkpoint placed in `local` needs its folder no more (no-op for a path)."""
        remote = self._remotes.pop(local, None)
        if remote is not None:
            remote.close()

    def close(self) -> None:
        for local in list(self._remotes):
            self.done(local)
        self._spool.close()


class RemoteCheckpoint:
    """One DCP checkpoint directory at an s3:// URL, with the local folder its files pass through."""

    def __init__(self, url: str, spool: Spool, timeout_s: float = 120.0, endpoint: Optional[str] = None):
        self.url = url.rstrip("/")
        self.place = S3Place.parse(self.url, "the DCP checkpoint")
        if not self.place.prefix:
            raise ConfigError(f"{url}: a DCP checkpoint is a prefix of a bucket (s3://bucket/run/step-10)")
        self.endpoint, self.timeout_s = endpoint, timeout_s
        self.bucket = bucket_for(self.place, endpoint, timeout_s)
        self.local = tempfile.mkdtemp(prefix=os.path.basename(self.place.prefix) + "-", dir=spool.open())

    def key(self, name: str) -> str:
        return self.place.key(name)

    @property
    def parent(self) -> S3Place:
        return S3Place(self.place.bucket, self.place.prefix.rsplit("/", 1)[0] if "/" in self.place.prefix else "")

    # -- writing ---------------------------------------------------------------
    def upload(self, local: str, part_bytes: int = 64 << 20) -> str:
        """A durable local file of the checkpoint uploaded under its name; its ETag."""
        return self.bucket.put_file(self.key(os.path.basename(local)), local, part_bytes, UPLOAD_CONCURRENCY) or ""

    def commit(self, info: CommitInfo) -> CommitInfo:
        """The record, written once, after every object it names; its counter above every record
        beside it (the same parent)."""
        counter = 1 + max((i.counter for i in committed_at(self.parent, endpoint=self.endpoint)), default=0)
        info = CommitInfo(step=info.step, path=self.url, bytes=info.bytes, counter=counter, time=info.time,
                          world_size=info.world_size, format=info.format, files=info.files, meta=info.meta)
        record.write_with(info, lambda raw: self.bucket.put_bytes(self.key(record.COMMIT_NAME), raw, create_once=True))
        return info

    def withdraw(self) -> None:
        """Its record, then its .metadata, gone (a save into a prefix that held a checkpoint)."""
        withdraw_at(self.url, self.endpoint, self.timeout_s)

    def discard(self, names: Optional[list] = None) -> None:
        """Objects of a failed save deleted (names: these; None: every one, the record first)."""
        if names is None:
            self.withdraw()
            names = [o.key for o in self.bucket.listing(self.key(""))]
            self.bucket.delete(names)
            for upload in self.bucket.uploads(self.key("")):
                self.bucket.abort_upload(upload)
            return
        self.bucket.delete([self.key(n) for n in names])

    def sweep_older(self) -> None:
        """Saves cut short beside this one whose step is below the newest committed checkpoint's
        there (nobody writes them any more): removed, as on a disk (fastckpt.dcp.committed's
        cut_short_below) — only a folder holding nothing but what a save writes (`*.distcp`,
        `.metadata`) and no record; its unfinished uploads of such files aborted. Nothing is swept
        directly under a bucket (the parent of s3://bucket/step-10 is the whole bucket)."""
        if not self.parent.prefix:
            return
        newest = committed_at(self.parent, endpoint=self.endpoint)
        if not newest or newest[0].step < 0:
            return
        below, base = newest[0].step, self.parent.key("")
        folders: dict[str, list[str]] = {}
        for o in self.bucket.listing(base):
            name, _, rest = o.key[len(base):].partition("/")
            if rest:
                folders.setdefault(name, []).append(rest)
        cut_short = {name for name, files in folders.items()
                     if 0 <= step_of_name(name) < below and name != os.path.basename(self.place.prefix)
                     and all(_save_file(f) for f in files)}
        for upload in self.bucket.uploads(base):
            name, _, rest = upload.key[len(base):].partition("/")
            if 0 <= step_of_name(name) < below and _save_file(rest) and (name in cut_short or name not in folders):
                self.bucket.abort_upload(upload)
        self.bucket.delete([base + name + "/" + f for name in sorted(cut_short) for f in folders[name]])

    # -- reading ---------------------------------------------------------------
    def read_record(self) -> Optional[CommitInfo]:
        """Its record, checked against its listed objects (each there, of its size and ETag); None
        when it has none."""
        objects = {o.key: o for o in self.bucket.listing(self.key(""))}
        if self.key(record.COMMIT_NAME) not in objects:
            return None
        return read_checked(self.bucket, self.place, objects, every_rank=False)

    def fetch(self, names: list[str], info: CommitInfo) -> None:
        """These objects of the checkpoint downloaded into the local folder (each once)."""
        from ..machine import read_threads
        os.makedirs(self.local, exist_ok=True)
        for name in names:
            local = os.path.join(self.local, record.plain_name(name, self.url))
            if os.path.exists(local):
                continue
            entry = next((f for f in info.files if f.name == name), None)
            if entry is None:
                raise CorruptCheckpointError(f"{self.url}/{name} is not an object its commit record names")
            self.bucket.download(self.key(name), local + ".part", entry.bytes, 16 << 20, read_threads())
            os.replace(local + ".part", local)

    def close(self) -> None:
        """Its local folder removed (the spool is its owner's)."""
        shutil.rmtree(self.local, ignore_errors=True)


def withdraw_at(url: str, endpoint: Optional[str] = None, timeout_s: float = 120.0) -> None:
    """The checkpoint at url stops being one: its record deleted, then its .metadata (a removal cut
    short after this leaves objects no reader takes for a checkpoint)."""
    place = S3Place.parse(url.rstrip("/"), "the DCP checkpoint")
    bucket = bucket_for(place, endpoint, timeout_s)
    bucket.delete([place.key(record.COMMIT_NAME)])
    bucket.delete([place.key(md_file.NAME)])


def _save_file(name: str) -> bool:
    """A file a DCP save writes (a rank's data, .metadata), and nothing else's."""
    return "/" not in name and (name.endswith(SUFFIX) or name == md_file.NAME)


def committed_at(parent: S3Place, problems: Optional[list] = None, endpoint: Optional[str] = None) -> list[CommitInfo]:
    """Every DCP checkpoint committed directly under the parent prefix, newest commit first."""
    return committed_under(bucket_for(parent, endpoint), parent, problems=problems)


def newest_committed_at(parent_url: str) -> Optional[tuple[str, int, int]]:
    """(URL, step, counter) of the newest committed checkpoint under an s3:// prefix, or None."""
    found = committed_at(S3Place.parse(parent_url.rstrip("/"), "the folder of DCP checkpoints"))
    if not found:
        return None
    info = found[0]
    return info.path, info.step if info.step >= 0 else step_of_name(info.path.rsplit("/", 1)[1]), info.counter
