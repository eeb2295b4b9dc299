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

Loading (`fetch`, folder_fetch.py): a folder the bucket has and the parent lacks is downloaded into
the parent on every rank that needs it, each object checked against the record's CRCs before it is
renamed into place, then its record written there: a local folder as the framework wrote it, committed.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from typing import Callable, Optional

from ...commit import record as commit
from ...commit.agreed_errors import AgreedErrors, report_each
from ...commit.agreement import Agreement, make_agreement
from ...commit.ordered import OrderedCommits
from ...commit.persist_unit import PersistCommit, Superseded
from ...commit_info import CommitInfo, FileEntry
from ...errors import CheckpointWriteError, CorruptCheckpointError
from ...write.deadline import Deadline
from ..tier_copy import upload_part
from .checked import committed_under, read_checked, recorded, remove_folder
from .folder_fetch import fetch_folder, holds_file
from .client import UPLOAD_CONCURRENCY, bucket_for
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
        with m.uploading():
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
        except OSError:
            try:  # the PUT may have landed though its answer did not: no record may outlive the objects
                m.bucket.delete([key])
            except OSError:
                pass  # the server out of reach: the next turn's sweep checks the records it finds
            raise
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


# A wait of the bucket's chain on other ranks (their uploads, their downloads) is bounded by each
# request's own time and retries (the client's), never by the size of a tag: the collectives of the
# mirror may wait that long.
COLLECTIVE_S = 24 * 3600.0


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
        self._agree: Agreement = make_agreement(max(config.commit_timeout_s, COLLECTIVE_S)) \
            if config.distributed is not False else Agreement()
        self._errors = AgreedErrors(self._agree)
        self._moving = 0  # uploads in flight here: the chain's progress while they last
        self._units = OrderedCommits(self._agree, Deadline(config.stall_timeout_s, self._progress),
                                     config.commit_timeout_s, name="fastckpt-bucket")
        self._lock = threading.Condition()
        self._bucket_lock = threading.Lock()  # rank 0's removals (retention) and clearing (a turn) apart
        self._queued: list[PersistCommit] = []  # issued and not landed, in order
        self._busy: set[str] = set()  # names being uploaded: retention spares them
        self._issued = 0
        self._whole: set[str] = set()  # recorded folders whose objects were checked whole (bucket lock)
        self.stats = {"uploaded": 0, "superseded": 0, "failed": 0, "swept": 0}

    def _progress(self) -> int:
        """Grows while an upload is in flight (each of its requests is bounded by the client)."""
        return int(time.monotonic()) if self._moving else 0

    @contextlib.contextmanager
    def uploading(self):
        with self._lock:
            self._moving += 1
        try:
            yield
        finally:
            with self._lock:
                self._moving -= 1

    # -- draining ----------------------------------------------------------------
    def drain(self, info: Optional[CommitInfo], folder: str = "") -> None:
        """A folder of the parent landed (every rank, its commit thread, in commit order — the same
        turns on every rank): info, committed (info.path: the local folder; rank 0's info holds the
        counter), is uploaded; None (withdrawn here, or nothing in it) takes its turn and uploads nothing."""
        skip = info is None
        if skip:
            info = CommitInfo(step=-1, path=os.path.abspath(folder or "."), bytes=0, counter=0, time=0.0,
                              world_size=self._agree.world_size, format="", files=())
        name = os.path.basename(info.path)
        unit = PersistCommit(info, self._agree.rank, [FolderObjects(self, name)],
                             lambda tier, src, folder, entry: tier.put_copy(src, folder, entry),
                             self._go, self._landed, self._retain, one_each=False)
        unit.label = f"the upload of {name!r} to {self.url}"
        unit.skip = skip
        with self._lock:
            self._issued += 1
            unit.seq = self._issued  # its place in the order every rank issues them: how errors are agreed
            self._queued.append(unit)
        self._units.issue(unit)

    def _go(self, unit: PersistCommit) -> bool:
        """The unit's turn (its commit thread, every rank): whether every rank uploads it now — each
        still has its files and none has a newer folder waiting —; then, on rank 0, what is left of
        killed writers swept and an earlier upload's record of the same name deleted, before any
        rank uploads a byte (a failure there fails the turn on every rank)."""
        name = os.path.basename(unit.info.path)
        with self._lock:
            newer = self._queued[-1] is not unit
            if not newer and not unit.skip:
                self._busy.add(name)
        ok = not newer and not unit.skip and all(holds_file(unit.info.path, f) for f in unit.info.files
                                                 if f.rank == self._agree.rank)
        if not self._agree.all_ok(ok, background=True):
            with self._lock:
                self._busy.discard(name)
            return False
        failed = ""
        if self._agree.rank == 0:
            try:  # no rank uploads before the collective below: nothing in the bucket is in flight
                with self._bucket_lock:
                    self._whole.discard(name)
                    self._sweep(spare=name)
                    self.bucket.delete([self.where.key(name, commit.COMMIT_NAME)])  # an earlier upload's
            except OSError as e:
                failed = str(e)
        if self._agree.all_ok(not failed, background=True):
            return True
        with self._lock:
            self._busy.discard(name)
        raise CheckpointWriteError(f"clearing {self.url} before the upload failed: "
                                   f"{failed or 'on rank 0, see its error there'}")

    def _landed(self, unit: PersistCommit, infos, error: Optional[BaseException]) -> None:
        name = os.path.basename(unit.info.path)
        with self._lock:  # counted and its error noted before anyone waiting is woken
            if error is None:
                self.stats["uploaded"] += 1
            elif isinstance(error, Superseded):
                self.stats["superseded"] += 0 if unit.skip else 1
            else:
                self.stats["failed"] += 1
                self._errors.landed(unit.seq, CheckpointWriteError(
                    f"{unit.label} failed: {error}; {name!r} stays committed in {os.path.dirname(unit.info.path)}, "
                    f"and the newest in the bucket stays its latest"))
            self._queued.remove(unit)
            self._busy.discard(name)
            self._lock.notify_all()

    def _retain(self) -> None:
        """Rank 0, once an upload landed: recorded folders beyond the newest `keep` removed, never
        one being uploaded (its turn waits for the removals under way)."""
        if self.keep <= 0 or self._agree.rank != 0:
            return
        try:
            with self._bucket_lock:
                for info in self.committed()[self.keep:]:
                    name = os.path.basename(info.path)
                    with self._lock:
                        busy = name in self._busy
                    if not busy:
                        self.remove(name)
        except OSError as e:
            log.warning("fastckpt: retention in %s failed: %s", self.url, e)

    def _sweep(self, spare: str) -> None:
        """Rank 0, at a turn (under the bucket lock): objects of folders without a record, folders
        whose record names objects that are not there (each record checked once), and unfinished
        uploads (a killed process's) removed, but those of `spare`, the folder about to be uploaded."""
        base = self.where.key("")
        objects = {o.key: o for o in self.bucket.listing(base)}

        def name_of(key: str) -> str:
            return key[len(base):].split("/", 1)[0]
        with_record = set(recorded(self.where, objects))
        for name in sorted(with_record - self._whole - {spare}):
            try:
                read_checked(self.bucket, S3Place(self.where.bucket, self.where.key(name)), objects, every_rank=False)
                self._whole.add(name)
            except CorruptCheckpointError:
                pass  # a record naming objects that are not there (its PUT's answer lost): swept below
        keep = (with_record & self._whole) | {spare}
        dead = [k for k in objects if "/" in k[len(base):] and name_of(k) not in keep]
        if dead:  # records first: a crash part-way never leaves a record naming objects that are gone
            self.bucket.delete(sorted(dead, key=lambda k: not k.endswith("/" + commit.COMMIT_NAME)))
        for upload in self.bucket.uploads(base):
            if name_of(upload.key) != spare:
                self.bucket.abort_upload(upload)
                dead.append(upload.key)
        self.stats["swept"] += len(dead)

    def newest_counter(self) -> int:
        """The highest counter a record in the bucket holds (0: none): the parent's next folder is
        numbered above it, so that a new run's folders are never taken for older ones."""
        try:
            return max((info.counter for info in self.committed()), default=0)
        except OSError as e:  # the local commit goes on: its counter is the parent's own
            log.warning("fastckpt: the bucket %s could not be listed for its newest counter: %s", self.url, e)
            return 0

    def raise_agreed(self) -> None:
        """Every rank, at one call (the next save): each upload that failed on any rank, raised
        through report on every rank alike."""
        report_each(self._errors.agreed(), self._report)

    def wait(self) -> None:
        """Until every upload issued so far has landed; raises (reports) this rank's failures."""
        with self._lock:
            self._lock.wait_for(lambda: not self._queued)
        report_each(self._errors.take_local(), self._report)

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
        return committed_under(self.bucket, self.where, problems=problems)

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
        self._whole.discard(name)
        remove_folder(self.bucket, S3Place(self.where.bucket, self.where.key(name)))

    def fetch(self, info: CommitInfo, parent: str) -> str:
        """The bucket's folder `info` (from committed()) made a committed local folder of parent, on
        every rank at one call (the caller's thread; folder_fetch.py); its local path. Its collectives
        may wait as long as the slowest rank's downloads: the mirror's own agreement."""
        return fetch_folder(self.bucket, self.where, self._agree, info, parent)
