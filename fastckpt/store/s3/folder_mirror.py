"""Committed folders of a local parent (a DeepSpeed save_dir's tags) mirrored in a bucket: the last
tier behind a local store whose layout a framework owns, and where a node that lost its disk
resumes from.

Layout (keys under the URL's prefix, the parent's own):
    PREFIX/NAME/FILE ...     each file of a committed folder, uploaded by the rank that wrote it
    PREFIX/NAME/COMMIT       the folder's commit record (the local one: every file's rank, size,
                             CRC-32; each object's ETag added), PUT once every rank's objects are complete
    PREFIX/latest            the newest folder's name, moved forward only (as DeepSpeed's `latest`)
so a copy of the prefix is the parent as the framework wrote it.

Draining: each folder committed locally is handed here on every rank (its commit thread) and
uploaded in the background from that committed copy, on an ordered commit of its own (one
PersistCommit per folder: fastckpt.commit.persist_unit, each file checked against the record on
the mapping it is sent from, a failed upload aborted); training never waits for the bucket. At its
turn a folder is uploaded only when every rank still has it and none has a newer one waiting (else
the newer goes instead: the bucket gets the newest at each turn). Then rank 0 PUTs the record
(If-None-Match: *, after deleting the record of an earlier upload under the same name before any
rank uploads), then `latest`. A failure is raised on every rank at their next save (the owner's
report); the folder stays committed locally and the bucket's newest stays what it was.

Leftovers: at each turn, before any rank uploads (every earlier upload has landed on every rank,
and no rank starts the next before the turn's collective), rank 0 deletes the objects of folders
without a record and aborts unfinished multipart uploads under the prefix: a killed process's.
Retention keeps the newest `keep` recorded folders (0: all), the record deleted first.

Loading (`fetch`): a folder the bucket has and the parent lacks is downloaded into the parent on
every rank that needs it, each object checked against the record's CRCs before it is renamed into
place, then its record written there: a local folder as the framework wrote it, committed.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import threading
from typing import Callable, Optional

from ...commit import record as commit
from ...commit.agreed_errors import AgreedErrors
from ...commit.agreement import Agreement, make_agreement
from ...commit.ordered import OrderedCommits
from ...commit.persist_unit import PersistCommit, Superseded
from ...commit_info import CommitInfo, FileEntry
from ...errors import CheckpointWriteError, CorruptCheckpointError
from ...fsutil import fsync_dir
from ...machine import read_threads
from ...verify import verify_file
from ...write.deadline import Deadline
from ..tier_copy import upload_part
from .checked import read_checked
from .client import GET_BYTES, UPLOAD_CONCURRENCY, bucket_for
from .place import S3Place

log = logging.getLogger("fastckpt")

LATEST = "latest"


class FolderObjects:
    """One folder's objects in the bucket, as PersistCommit sees a tier behind: its files uploaded
    (new_dir, put_copy), its record PUT by rank 0 (commit), this rank's objects deleted when the
    upload failed (abort)."""

    def __init__(self, mirror: "FolderMirror", name: str):
        self.mirror, self.name = mirror, name
        self.root = mirror.where.url_of(mirror.where.key(name))
        self.uploaded: list[str] = []

    def new_dir(self, step: int, counter: int) -> str:
        return self.root

    def put_copy(self, src: str, url: str, entry: FileEntry, direct_io: bool = True) -> FileEntry:
        m = self.mirror
        key = m.where.key(self.name, entry.name)
        self.uploaded.append(key)
        etag = upload_part(m.bucket, key, src, entry, m.part_bytes, UPLOAD_CONCURRENCY)
        return dataclasses.replace(entry, etag=etag or "")

    def commit_rank(self, url: str, info: CommitInfo) -> None:
        pass

    def commit(self, info: CommitInfo) -> None:
        """Rank 0, every rank's objects complete: the record, written once; then `latest`."""
        m = self.mirror
        key = m.where.key(self.name, commit.COMMIT_NAME)
        try:
            commit.write_with(info, lambda raw: m.bucket.put_bytes(key, raw, create_once=True))
        except FileExistsError as e:
            raise CheckpointWriteError(f"{m.where.url_of(key)} exists already: another writer committed "
                                       f"{self.name!r} there") from e
        try:
            m.move_latest(self.name, info.counter)
        except OSError as e:  # committed by its record: `latest` names it for other tools
            log.warning("fastckpt: %s is committed, but moving %s to it failed: %s", self.root,
                        m.where.url_of(m.where.key(LATEST)), e)

    def abort(self, folder, part, rank: int, stuck: bool = False) -> None:
        """A failed upload: what this rank uploaded of it deleted (a failed object's upload was
        aborted by the client already)."""
        keys, self.uploaded = self.uploaded, []
        self.mirror.bucket.delete(keys)


class FolderMirror:
    """Args: url (s3://bucket/prefix: where the parent's folders are mirrored); remote: how the server
    is reached (fastckpt.store.url_files.Remote); config: the owner's settings (its deadlines, whether
    it runs distributed); keep: recorded folders kept in the bucket (0: all); report(error): what a
    failed upload does on the caller's thread at raise_agreed (default: raise it)."""

    def __init__(self, url: str, remote, config, keep: int = 0,
                 report: Optional[Callable[[BaseException], None]] = None):
        self.where = S3Place.parse(url, "the bucket")
        self.url = self.where.url
        self.bucket = bucket_for(self.where, remote.endpoint, remote.timeout_s)
        self.part_bytes, self.keep, self._report = remote.part_bytes, keep, report
        self._agree: Agreement = make_agreement(config.commit_timeout_s) if config.distributed is not False \
            else Agreement()
        self._errors = AgreedErrors(self._agree)
        self._units = OrderedCommits(self._agree, Deadline(config.stall_timeout_s), config.commit_timeout_s,
                                     name="fastckpt-bucket")
        self._lock = threading.Condition()
        self._queued: list[PersistCommit] = []  # issued and not landed, in order
        self._busy: set[str] = set()  # names being uploaded: retention spares them
        self._issued = 0
        self.stats = {"uploaded": 0, "superseded": 0, "failed": 0, "swept": 0}

    # -- draining ----------------------------------------------------------------
    def drain(self, info: CommitInfo) -> None:
        """A folder just committed locally (every rank, its commit thread, in commit order): its
        upload issued (info.path: the local folder; rank 0's info holds the counter)."""
        name = os.path.basename(info.path)
        unit = PersistCommit(info, self._agree.rank, [FolderObjects(self, name)],
                             lambda tier, src, folder, entry: tier.put_copy(src, folder, entry),
                             self._go, self._landed, self._retain, one_each=False)
        unit.label = f"the upload of {name!r} to {self.url}"
        with self._lock:
            self._issued += 1
            unit.seq = self._issued  # its place in the order every rank issues them: how errors are agreed
            self._queued.append(unit)
        self._units.issue(unit)

    def _go(self, unit: PersistCommit) -> bool:
        """The unit's turn (its commit thread, every rank): whether every rank uploads it now."""
        name = os.path.basename(unit.info.path)
        with self._lock:
            newer = self._queued[-1] is not unit
            if not newer:
                self._busy.add(name)
        here = [f for f in unit.info.files if f.rank == self._agree.rank]
        ok = not newer and all(os.path.getsize(os.path.join(unit.info.path, f.name)) == f.bytes
                               if os.path.isfile(os.path.join(unit.info.path, f.name)) else False for f in here)
        failed = None
        if ok and self._agree.rank == 0:
            try:  # no rank uploads before this turn's collective: nothing in the bucket is in flight
                self._sweep(spare=name)
                self.bucket.delete([self.where.key(name, commit.COMMIT_NAME)])  # an earlier upload of the name
            except OSError as e:
                failed, ok = e, False
        if self._agree.all_ok(ok, background=True):
            return True
        with self._lock:
            self._busy.discard(name)
        if failed is not None:  # the bucket is out of reach: a failure (every rank hears of it), not a newer tag
            raise CheckpointWriteError(f"clearing {self.url} before the upload failed: {failed}")
        return False

    def _landed(self, unit: PersistCommit, infos, error: Optional[BaseException]) -> None:
        name = os.path.basename(unit.info.path)
        with self._lock:
            self._queued.remove(unit)
            self._busy.discard(name)
            self._lock.notify_all()
        if error is None:
            self.stats["uploaded"] += 1
        elif isinstance(error, Superseded):
            self.stats["superseded"] += 1
        else:
            self.stats["failed"] += 1
            self._errors.landed(unit.seq, CheckpointWriteError(
                f"{unit.label} failed: {error}; {name!r} stays committed in {os.path.dirname(unit.info.path)}, "
                f"and the newest in the bucket stays its latest"))

    def _retain(self) -> None:
        if self.keep <= 0 or self._agree.rank != 0:
            return
        try:
            with self._lock:
                for info in self.committed()[self.keep:]:
                    name = os.path.basename(info.path)
                    if name not in self._busy:
                        self.remove(name)
        except OSError as e:
            log.warning("fastckpt: retention in %s failed: %s", self.url, e)

    def _sweep(self, spare: str) -> None:
        """Rank 0, at a turn: objects of folders without a record and unfinished uploads (a killed
        process's) removed, but those of `spare`, the folder about to be uploaded."""
        base = self.where.key("")
        keys = [o.key for o in self.bucket.listing(base)]
        recorded = {k[len(base):].split("/", 1)[0] for k in keys if k.endswith("/" + commit.COMMIT_NAME)}
        dead = [k for k in keys if "/" in k[len(base):] and k[len(base):].split("/", 1)[0] not in recorded | {spare}]
        if dead:
            self.bucket.delete(dead)
        for upload in self.bucket.uploads(base):
            if upload.key[len(base):].split("/", 1)[0] != spare:
                self.bucket.abort_upload(upload)
                dead.append(upload.key)
        self.stats["swept"] += len(dead)

    def raise_agreed(self) -> None:
        """Every rank, at one call (the next save): each upload that failed on any rank, raised
        through report on every rank alike."""
        for e in self._errors.agreed():
            if self._report is None:
                raise e
            self._report(e)

    def wait(self) -> None:
        """Until every upload issued so far has landed; raises (reports) this rank's failures."""
        with self._lock:
            self._lock.wait_for(lambda: not self._queued)
        for e in self._errors.take_local():
            if self._report is None:
                raise e
            self._report(e)

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._units.join()
            self._agree.close()

    # -- reading -----------------------------------------------------------------
    def committed(self, problems: Optional[list] = None) -> list[CommitInfo]:
        """The folders with a record in the bucket whose objects are all there, of their sizes and
        ETags (checked.py), newest (by counter) first; problems: what was passed over, said."""
        base = self.where.key("")
        objects = {o.key: o for o in self.bucket.listing(base)}
        found = []
        for key in objects:
            rest = key[len(base):]
            if rest.count("/") != 1 or not rest.endswith("/" + commit.COMMIT_NAME):
                continue
            folder = S3Place(self.where.bucket, self.where.key(rest.split("/", 1)[0]))
            try:
                found.append(read_checked(self.bucket, folder, objects, every_rank=False))
            except (CorruptCheckpointError, OSError) as e:
                if problems is not None:
                    problems.append(str(e))
        return sorted(found, key=lambda info: info.counter, reverse=True)

    def move_latest(self, name: str, counter: int) -> None:
        """`latest` names `name` unless it names a recorded folder with a higher counter."""
        key = self.where.key(LATEST)
        try:
            current = self.bucket.get_bytes(key, 4096).decode().strip()
        except (OSError, UnicodeDecodeError):
            current = ""
        if current and current != name:
            try:
                raw = self.bucket.get_bytes(self.where.key(current, commit.COMMIT_NAME), commit.MAX_RECORD)
                if commit.parse(raw, self.where.url_of(self.where.key(current))).counter > counter:
                    return
            except (OSError, CorruptCheckpointError):
                pass  # not a recorded folder: this one is newer
        self.bucket.put_bytes(key, name.encode())

    def remove(self, name: str) -> None:
        """A folder's objects deleted, its record first (a crash part-way leaves objects no reader
        takes for a folder, never a record naming objects that are gone)."""
        record_key = self.where.key(name, commit.COMMIT_NAME)
        self.bucket.delete([record_key])
        self.bucket.delete([o.key for o in self.bucket.listing(self.where.key(name) + "/") if o.key != record_key])

    def fetch(self, info: CommitInfo, parent: str, agree: Agreement) -> str:
        """The bucket's folder `info` (from committed()) made a committed local folder of parent, on
        every rank at one call (agree: the caller's, on its thread); its local path. Every rank or
        none: CorruptCheckpointError naming what failed (an object missing or damaged: its URL)."""
        name = os.path.basename(info.path)
        folder = os.path.join(parent, name)
        local = dataclasses.replace(info, path=folder)

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
            if _holds(folder, info):
                return
            aside = os.path.join(parent, f".{name}.fastckpt-stale-{os.getpid()}")
            try:
                os.rename(folder, aside)
            except FileNotFoundError:
                return
            shutil.rmtree(aside, ignore_errors=True)

        def share() -> None:  # on a shared disk each rank fetches its share
            os.makedirs(folder, exist_ok=True)
            for i, entry in enumerate(info.files):
                if i % agree.world_size == agree.rank and not _has(folder, entry):
                    self._download(info, entry, folder)

        def rest() -> None:  # on a disk of its own a rank fetches what the others put elsewhere
            for entry in info.files:
                if not _has(folder, entry):
                    self._download(info, entry, folder)
            fsync_dir(folder)
            commit.write(local)

        os.makedirs(parent, exist_ok=True)
        step(clear)
        step(share)
        step(rest)
        return folder

    def _download(self, info: CommitInfo, entry: FileEntry, folder: str) -> None:
        """One object into folder: downloaded beside its name, every CRC checked, made durable,
        renamed into place; CorruptCheckpointError names the object."""
        url = f"{info.path}/{entry.name}"
        tmp = os.path.join(folder, f".{entry.name}.fastckpt-fetch-{os.getpid()}.tmp")
        try:
            self.bucket.download(self.where.key_of(url), tmp, entry.bytes, GET_BYTES, read_threads())
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


def _has(folder: str, entry: FileEntry) -> bool:
    path = os.path.join(folder, entry.name)
    return os.path.isfile(path) and os.path.getsize(path) == entry.bytes


def _holds(folder: str, info: CommitInfo) -> bool:
    """folder is already info's folder, committed (its record's counter and every file's size)."""
    try:
        here = commit.read(folder, None, every_rank=False)
    except (OSError, CorruptCheckpointError):
        return False
    return here.counter == info.counter and all(_has(folder, f) for f in info.files)

