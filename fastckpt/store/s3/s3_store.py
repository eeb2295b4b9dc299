"""The S3 store: the Checkpointer's layout in a bucket, made crash-consistent without a rename.

Layout (keys under the place's prefix, as the root store's folders):
    PREFIX/step-00000100.c000007/rank-0.TOKEN.pt ...        each rank's part, one object each (TOKEN:
                                                            its writer's, so writers never share a key)
    PREFIX/step-00000100.c000007/COMMIT                    the commit record, written last, once
    PREFIX/latest                                          {"dir", "step", "counter"}, moved forward

A rank's part is written to its local spool (spool.py: through a mapping of a file on the memory
filesystem when there is room, so the copy the gate waits for is the only one) and, on the commit
thread, uploaded as one multipart upload, its parts in parallel (each request signed over its
payload's SHA-256, which the server checks). Once every rank's object is complete, rank 0 PUTs the
record — the objects' names, sizes, ETags and CRC-32s — with If-None-Match: * (a record is written
once, never over another), then `latest`. The record makes the checkpoint exist: `committed()`
trusts nothing without one, and passes over a record whose objects are missing, sized otherwise or
carry another ETag than it names.

A failed upload aborts its multipart upload (no parts left billed) and fails the checkpoint on
every rank (the commit's agreement); the previous checkpoint stays the latest. Uploads a killed
process left behind are aborted by the next writer's start (before any rank of it writes) and by
retention: only those of checkpoints older than the newest committed one, which can never commit.
The layout's own rules (the counter, `latest` moved only forward, retention, the listing) are the
root store's (root_store.StepFolders), over this prefix's listing.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
import uuid
from typing import Optional

from ... import _native
from ...commit import record as commit
from ...commit_info import CommitInfo, FileEntry
from ...errors import CheckpointWriteError, ConfigError, CorruptCheckpointError
from ...format import load_file
from ...machine import read_threads
from ...verify import verify_file
from ...write.protocol import FileSink, MemoryFileSink
from ..protocol import Listed
from ..root_store import DIR_RE, EXT, LATEST, StepFolders, dir_name
from ..tier_copy import upload_part
from .checked import committed_under, read_checked, remove_folder
from .client import GET_BYTES, MIN_PART, UPLOAD_CONCURRENCY, Bucket, ListedObject, Upload
from .place import S3Place, is_s3
from .spool import Spool

log = logging.getLogger("fastckpt")


class S3Store(StepFolders):
    kind = survey_kind = "s3"
    record_word = "object"

    def __init__(self, url: str, endpoint: Optional[str] = None, part_mb: int = 64, timeout_s: float = 120.0):
        self.where = S3Place.parse(url)
        self.root = self.where.url
        self.bucket = Bucket(self.where, endpoint, request_s=timeout_s, retry_s=timeout_s)
        self.part_bytes = max(MIN_PART, part_mb << 20)
        self.spool = Spool()
        self.only: Optional[str] = None  # opened at one checkpoint (place_at)
        self._latest_lock = threading.Lock()
        self._begun: dict[str, str] = {}  # spooled part -> its object's key
        self._refused: set[str] = set()  # checkpoints whose record PUT found another writer's
        self.token = uuid.uuid4().hex[:8]

    @classmethod
    def open(cls, config, rank: int, world_size: int) -> "S3Store":
        if not is_s3(config.root):
            raise ConfigError(f"store='s3' needs root='s3://bucket/prefix', got {config.root!r}")
        return cls(config.root, config.endpoint, config.chunk_mb, config.stall_timeout_s)

    def _dir_key(self, url: str) -> str:
        return self.where.key_of(url)

    @property
    def sink_kind(self) -> str:
        """"memory" while parts are spooled on a memory filesystem (written through a mapping)."""
        self.spool.open()
        return "memory" if self.spool.memory else "file"

    # -- 0. opening ----------------------------------------------------------
    def prepare(self) -> None:
        """The bucket answers and takes writes under the prefix: a probe object put and deleted."""
        probe = self.where.key(f".fastckpt-probe-{os.getpid()}")
        try:
            self.bucket.put_bytes(probe, b"fastckpt")
            self.bucket.delete([probe])
        except OSError as e:
            raise CheckpointWriteError(f"cannot write checkpoints to {self.root}: {e}") from e
        self.spool.open()

    def remove_uncommitted(self) -> None:
        """Rank 0, before any rank of this writer saves: checkpoints a dead writer never committed,
        and its unfinished uploads, removed."""
        self._remove_dead()  # from one listing
        base = self.where.key("")
        for upload in self.bucket.uploads(base):  # a checkpoint's part only: another tool's uploads are theirs
            if DIR_RE.match(upload.key[len(base):].split("/", 1)[0]):
                self.bucket.abort_upload(upload)

    @property
    def bounded(self) -> bool:
        """While parts are spooled on a memory filesystem, its room is checked at every save."""
        self.spool.open()
        return self.spool.memory

    def fits(self, nbytes: int, concurrency: int) -> bool:
        """Room in the spool for the parts in flight (the memory filesystem's, when spooling there)."""
        return not self.spool.memory or self.spool.room() >= nbytes * (concurrency + 1)  # spares count as room

    def shrink(self, nbytes: int, concurrency: int) -> str:
        self.spool.to_disk()
        return (f"the memory filesystem has no room to spool {concurrency} checkpoints of {nbytes} bytes on their "
                f"way to {self.root}; they are spooled on disk ({self.spool.folder})")

    # -- 1-2. writing --------------------------------------------------------
    def begin(self, step: int, counter: int, rank: int, fmt: str, target=None, plan=None,
              meta=None) -> tuple[str, str]:
        name = dir_name(step, counter)
        part = self.spool.path(f"{name}.{self.file_name(rank, fmt)}")
        self._begun[part] = self.where.key(name, self.file_name(rank, fmt))
        self.spool.reuse_into(part)  # an uploaded part's memory, written over
        return self.where.url_of(self.where.key(name)), part

    def file_name(self, rank: int, fmt: str) -> str:
        """rank-R.TOKEN.pt: the token is this writer's, so two writers that took the same counter
        (two jobs on one prefix) never write over each other's objects; the record names which."""
        return f"rank-{rank}.{self.token}.{EXT[fmt]}"

    def sink(self, part: str, direct_io: bool):
        return MemoryFileSink(part) if self.spool.memory and part.startswith(self.spool.folder) else FileSink(
            part, direct_io)

    def finish_write(self, write, part: str):
        """The commit thread: the part written to the spool, then uploaded (multipart, parts in
        parallel); its object's ETag goes into the record. A failed upload is aborted."""
        result = write.finish()
        key = self._begun[part]
        try:
            result.etag = self.bucket.put_file(key, part, self.part_bytes, UPLOAD_CONCURRENCY) or ""
        except OSError as e:
            _unlink(part)  # never written over: the failed upload's client may still hold its pages
            raise CheckpointWriteError(str(e)) from e
        self.spool.keep(part)  # uploaded: its memory written over by a later part
        return result

    # -- as the last tier: a part committed on a tier in front, copied here ------
    def new_dir(self, step: int, counter: int) -> str:
        """A checkpoint's URL (a prefix: nothing to make)."""
        return self.where.url_of(self.where.key(dir_name(step, counter)))

    def put_copy(self, src: str, url: str, entry: FileEntry, direct_io: bool = True) -> FileEntry:
        """A part committed on a tier in front (src, its record's entry) uploaded into the checkpoint
        at url, checked against its record before a byte is sent (a damaged copy never reaches the
        bucket); its entry here (this writer's object name, its ETag). A failed upload is aborted."""
        name = f"rank-{entry.rank}.{self.token}.{entry.name.rsplit('.', 1)[-1]}"
        etag = upload_part(self.bucket, self.where.key_of(url) + "/" + name, src, entry, self.part_bytes,
                           UPLOAD_CONCURRENCY)
        return dataclasses.replace(entry, name=name, etag=etag or "")

    # -- 3-4. committing -------------------------------------------------------
    def commit_file(self, ckpt_id: str, part: str, result) -> str:
        return self.where.url_of(self._begun.pop(part))

    def commit(self, info: CommitInfo) -> None:
        """Rank 0, every rank's object complete: the record, written once; then `latest`."""
        key = self.where.key(os.path.basename(info.path), commit.COMMIT_NAME)
        try:
            commit.write_with(info, lambda raw: self.bucket.put_bytes(key, raw, create_once=True))
        except FileExistsError as e:
            self._refused.add(info.path)  # its objects may be the other writer's: abort() leaves them
            raise CheckpointWriteError(f"{self.where.url_of(key)} exists already: another writer committed "
                                       "this checkpoint") from e
        try:
            self.move_latest(info)
        except OSError as e:  # committed by its record: `latest` only names it for other tools
            log.warning("fastckpt: %s is committed, but moving %s to it failed: %s", info.path,
                        self.where.url_of(self.where.key(LATEST)), e)

    def abort(self, ckpt_id: Optional[str], part: Optional[str], rank: int, stuck: bool = False) -> None:
        """A failed checkpoint: this rank's spooled part gone, its upload aborted and its object
        deleted; rank 0 deletes what the other ranks uploaded of it too."""
        key = self._begun.pop(part, None) if part is not None else None
        if part is not None and not stuck:
            _unlink(part)
        if key is not None:  # this writer's own object (its name is this writer's alone)
            self.bucket.abort_uploads_of(key)
            self.bucket.delete([key])
        if ckpt_id in self._refused:  # another writer's record is there: the rest is not ours to delete
            self._refused.discard(ckpt_id)
            return
        if rank == 0 and ckpt_id is not None:
            self.remove(ckpt_id)

    # -- 5-6. listing and reading ----------------------------------------------
    def _objects(self, under: str = "") -> dict[str, ListedObject]:
        """key -> its listing (size, ETag) of every object under the prefix (or one checkpoint of it)."""
        prefix = self.where.key(under) + "/" if under else self.where.key("")
        return {o.key: o for o in self.bucket.listing(prefix)}

    def _dirs(self, objects: Optional[dict] = None) -> list[tuple[int, int, str]]:
        """(step, counter, URL) of every checkpoint with an object here, committed or not."""
        objects = self._objects() if objects is None else objects
        base = self.where.key("")
        found = {}
        for key in objects:
            name = key[len(base):].split("/", 1)[0]
            m = DIR_RE.match(name)
            if m and "/" in key[len(base):]:
                found[name] = (int(m.group(1)), int(m.group(2)), self.where.url_of(self.where.key(name)))
        return sorted(found.values(), key=lambda d: -d[1])

    def _has_record(self, url: str, objects: Optional[dict] = None) -> bool:
        key = self._dir_key(url) + "/" + commit.COMMIT_NAME
        return key in objects if objects is not None else self.bucket.size_of(key) is not None

    def _seen(self) -> dict[str, ListedObject]:
        return self._objects()  # one listing for a whole pass (retention, the listing)

    def _latest_bytes(self) -> bytes:
        return self.bucket.get_bytes(self.where.key(LATEST), 4096)

    def _put_latest(self, body: bytes) -> None:
        self.bucket.put_bytes(self.where.key(LATEST), body)

    def _read_listed(self, url: str, objects: Optional[dict] = None) -> CommitInfo:
        """The record of the checkpoint at url, checked against the listed objects (checked.py)."""
        return read_checked(self.bucket, S3Place(self.where.bucket, self._dir_key(url)),
                            self._objects() if objects is None else objects, every_rank=True)

    def committed(self, problems: Optional[list] = None) -> list[CommitInfo]:
        # an unreachable server raises: it is not "nothing committed"
        return committed_under(self.bucket, self.where, self._objects(), every_rank=True,
                               named=lambda name: DIR_RE.match(name) is not None,
                               passed=(CorruptCheckpointError, FileNotFoundError), problems=problems)

    def _download(self, info: CommitInfo, rank: int) -> str:
        """This rank's object of info, in a spool file (parallel ranged GETs); its path."""
        entry = info.entry_for(rank)
        key = self._dir_key(info.path) + "/" + entry.name
        path = os.path.join(self.spool.folder_for(entry.bytes),
                            f"load-{threading.get_ident()}-{os.path.basename(info.path)}.{entry.name}")
        self.bucket.download(key, path, entry.bytes, GET_BYTES, read_threads())
        return path

    def load(self, info: CommitInfo, rank: int, map_location=None, verify: bool = True, weights_only: bool = True,
             mmap=None, into=None):
        """Downloaded into the spool, then read as any file is (every CRC checked); the spool file
        is unlinked once read (a mapping of it keeps its pages)."""
        path = self._download(info, rank)
        try:
            with self._named(path, info, rank):
                return load_file(path, map_location, verify, weights_only,
                                 expect_crc=info.entry_for(rank).crc32 if verify else None, mmap=mmap, into=into)
        finally:
            _unlink(path)

    def verify(self, info: CommitInfo) -> None:
        for f in info.files:
            path = self._download(info, f.rank)
            try:
                with self._named(path, info, f.rank):
                    verify_file(path, f)
            finally:
                _unlink(path)

    def verify_object(self, url: str, entry) -> str:
        """One object of a committed checkpoint (its URL and its record's FileEntry), every byte
        read and checked; a one-line summary naming the URL (`fastckpt verify`)."""
        dir_url, name = url.rsplit("/", 1)
        info = CommitInfo(step=-1, path=dir_url, bytes=entry.bytes, counter=0, time=0.0, world_size=entry.rank + 1,
                          format="", files=(entry,))
        path = self._download(info, entry.rank)
        try:
            with self._named(path, info, entry.rank):
                return verify_file(path, entry).replace(path, url)
        finally:
            _unlink(path)

    @contextlib.contextmanager
    def _named(self, path: str, info: CommitInfo, rank: int):
        """A damage found in a downloaded part is said of its object (its URL), not of the spool file."""
        try:
            yield
        except CorruptCheckpointError as e:
            raise CorruptCheckpointError(str(e).replace(path, info.file_for(rank))) from None

    # -- 7-8. removing, closing --------------------------------------------------
    def remove(self, url: str) -> None:
        """A checkpoint's objects deleted, its record first (a crash part-way leaves objects no
        reader takes for a checkpoint, never a record naming objects that are gone)."""
        remove_folder(self.bucket, S3Place(self.where.bucket, self._dir_key(url)))

    def _retained(self, newest: int, in_flight: set) -> None:
        self.sweep_uploads(newest, in_flight)  # those of checkpoints older than the newest can never commit

    def sweep_uploads(self, newest: int, in_flight: set) -> list[Upload]:
        """Unfinished uploads of checkpoints older than counter `newest`, not in flight, aborted."""
        base = self.where.key("")
        aborted = []
        for upload in self.bucket.uploads(base):
            m = DIR_RE.match(upload.key[len(base):].split("/", 1)[0])
            url = self.where.url_of(upload.key.rsplit("/", 1)[0])
            if m and int(m.group(2)) < newest and url not in in_flight:
                self.bucket.abort_upload(upload)
                aborted.append(upload)
        return aborted

    def close(self) -> None:
        self.spool.close()
        _native.purge_memory_maps(True)  # the spooled parts' mappings held for a next save: there is none

    # -- 9-10. the command's view ----------------------------------------------
    @classmethod
    def place_at(cls, path: str) -> Optional["S3Store"]:
        """An s3:// place (or one checkpoint of it), read with the settings AWS tools read."""
        if not is_s3(path):
            return None
        place = S3Place.parse(path.rstrip("/"), "the place")
        name = place.prefix.rsplit("/", 1)[-1]
        if DIR_RE.match(name):
            store = cls(place.url_of(place.prefix.rsplit("/", 1)[0]) if "/" in place.prefix
                        else f"s3://{place.bucket}")
            store.only, store.single = name, True
        else:
            store = cls(place.url)
        store.place = path
        return store

    def listing(self) -> list[Listed]:
        """Every checkpoint (one, when opened at one), newest first, then the unfinished uploads."""
        rows = super().listing()
        base = self.where.key("")
        for upload in self.bucket.uploads(base if self.only is None else f"{base}{self.only}/"):
            rows.append(Listed(upload.key[len(base):], self.where.url_of(upload.key), "temporary",
                               f"an unfinished multipart upload begun {time.ctime(upload.initiated)}",
                               time=upload.initiated))
        return rows


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
