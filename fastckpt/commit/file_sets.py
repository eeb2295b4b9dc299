"""One commit for a set of files across ranks: every file durable first, then one record.

A set is what the ranks write into one directory for one checkpoint: any number of files per
rank (some ranks may write none), each a fastckpt save in flight (a Pending). Sets commit
through the ordered commit (commit.ordered) in the order they were submitted, the same on
every rank:

  1. this rank's files of the set, durable (each waited for under the Deadline) at their paths
     (behind a memory tier: persisted there, not only committed in memory); `on_durable`
     runs for each (a pool-backed file leaves its pointer where the framework looks);
  2. once every rank's files are durable, rank 0 writes the one record (commit.record.write:
     versioned JSON with its own CRC-32; each file's rank, size, CRC-32 and chunk CRCs) into
     the set's directory (`COMMIT`), with a counter one above any record under the same parent
     directory;
  3. `after_record(info)`: what the convention writes once the set is real (DeepSpeed's
     `fastckpt-latest`); `committed(info)` on every rank: what is done with it next (its upload
     to a bucket: fastckpt.store.s3.folder_mirror).

The parent directory owns its sets: a framework removing it while sets of it are in flight
(Lightning's ModelCheckpoint dropping a checkpoint it no longer keeps) withdraws it — those
sets are not committed, their failures are no error, and the directory is deleted once the
last of them lands. `withdraw_anywhere` asks every FileSets of the process (what a framework's
removal calls, through its plugin: lightning_fastckpt.watch). A DeepSpeed tag is one set
(deepspeed_fastckpt.tags says where its record lies); the Checkpointer's own checkpoints (one file per rank) commit through
fastckpt.commit.checkpoint_unit, into the same record format through the same writer.
A framework that gathers its ranks' files itself (DCP's finish, on its coordinator) commits the
set with `commit_gathered` (a GatheredCommit through the same ordered commit): the same record,
its counter one above any under the parent.
"""
from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import weakref
from typing import Callable, Optional

from ..errors import CheckpointWriteError
from ..write.deadline import Deadline
from . import record as commit
from .agreed_errors import AgreedErrors, report_each
from .agreement import Agreement
from .committed_under import CommittedUnder
from .ordered import OrderedCommits
from .protocol import CommitUnit
from ..commit_info import CommitInfo, FileEntry


log = logging.getLogger("fastckpt")

_live: "weakref.WeakSet[FileSets]" = weakref.WeakSet()


_counting = threading.Lock()  # a gathered set's counter is read from the disk and written with its record


def gathered_commits(stall_s: float) -> OrderedCommits:
    """The ordered commit of one coordinator's gathered sets (a FastStorageWriter's saves, in the
    order their finish came): one rank decides, so no other rank takes part. stall_s: how long
    a commit may wait for the one before without progress."""
    return OrderedCommits(Agreement(), Deadline(stall_s), 0.0, name="fastckpt-gathered")


def commit_gathered(directory: str, part: Callable[[], list], step: int, world_size: int,
                    commits: OrderedCommits, fmt: str = "torch", meta: Optional[dict] = None,
                    write: Optional[Callable[[CommitInfo], CommitInfo]] = None) -> CommitInfo:
    """Commits a set whose ranks' files its framework already gathered on this coordinator (DCP's
    finish) as a GatheredCommit through `commits` (gathered_commits(); its owner's close() joins
    it); returns once its record is durable, or raises why it is not. part(): the coordinator's
    own part made durable (DCP's .metadata), returning every file's FileEntry. write(info): where
    the record goes when not into the directory (an object store: its counter taken there; returns
    the info as committed)."""
    unit = GatheredCommit(directory, part, step, world_size, fmt, meta, write)
    commits.issue(unit)
    return unit.result()


def withdraw_anywhere(owner: str) -> bool:
    """owner is being removed by the framework that keeps it: True if a set of it is in flight
    in any FileSets of this process (it is then deleted once they land, and they are not
    committed); False if the caller deletes it now."""
    withdrawn = [sets.withdraw(owner) for sets in list(_live)]  # every one of them, no short cut
    return any(withdrawn)


class FileSets:
    """Commits sets of files, each into its own directory, in the order they were submitted.

    Args:
        agreement: how the ranks agree (fastckpt.commit.agreement.make_agreement).
        deadline: bounds every wait (a file's write, the set before, the other ranks);
            slack_s: how much longer than the deadline a wait for other ranks may take.
        newest_counter(parent): the highest counter of a record already under parent (0: none);
            by default read from the records of parent's folders.
        after_record(info): run on rank 0 once a set's record is durable.
        on_durable(path): run for each file once it is durable.
        committed(info, directory): run on every rank for every set that landed (its commit thread,
            in commit order: the same calls on every rank), info its CommitInfo once committed
            (rank 0's holds the counter), None when it was not (failed, withdrawn, empty): what is
            done with it next (a bucket's upload).
        report(error): what a failed set does at the next `raise_errors` (default: raise it).
    """

    def __init__(self, agreement: Agreement, deadline: Deadline, slack_s: float,
                 newest_counter: Optional[Callable[[str], int]] = None,
                 after_record: Optional[Callable[[CommitInfo], None]] = None,
                 on_durable: Optional[Callable[[str], None]] = None,
                 report: Optional[Callable[[BaseException], None]] = None, name: str = "fastckpt-set",
                 committed: Optional[Callable[[Optional[CommitInfo], str], None]] = None):
        self.agreement, self.deadline, self.slack_s = agreement, deadline, slack_s
        self.committed = committed
        self._newest_counter = newest_counter or self._newest_record
        self.after_record, self.on_durable, self._report = after_record, on_durable, report
        self._commits = OrderedCommits(agreement, deadline, slack_s, name=name)
        self._cv = threading.Condition()
        self._errors = AgreedErrors(agreement)  # failed sets, by their place in the order they were submitted
        self._submitted = 0
        self._owners: dict[str, int] = {}  # parent directory -> sets of it in flight
        self._withdrawn: set[str] = set()  # parents to delete once their sets land
        self._counters: dict[str, int] = {}  # parent -> the next counter (rank 0)
        _live.add(self)

    # -- submitting ------------------------------------------------------
    def submit(self, directory: str, files: list, step: int, fmt: str = "torch", meta: Optional[dict] = None,
               label: Optional[str] = None) -> None:
        """files: [(path, Pending)], this rank's files of the set, each directly inside
        `directory`; returns at once (the set commits on its own thread)."""
        owner = _owner(directory)
        with self._cv:
            self._owners[owner] = self._owners.get(owner, 0) + 1
            self._submitted += 1
            seq = self._submitted
        self._commits.issue(FileSetCommit(self, directory, files, step, fmt, meta, label, seq))

    # -- waiting ---------------------------------------------------------
    def wait_for(self, owner: str) -> None:
        """Until no set under `owner` (a parent directory) is in flight here; raises nothing
        but WriteStalled."""
        key = os.path.abspath(owner)
        self._until(f"the checkpoints in flight of {owner}", lambda: self._owners.get(key, 0) == 0)

    def wait(self) -> None:
        """Until every submitted set is committed (or failed); raises the first failure."""
        self._until("the checkpoints in flight", lambda: not self._owners)
        self.raise_errors()

    def _until(self, what: str, condition: Callable[[], bool]) -> None:
        def attempt(seconds: float) -> bool:
            with self._cv:
                return self._cv.wait_for(condition, seconds)
        self.deadline.wait(what, attempt, slack=self.slack_s)

    def raise_errors(self) -> None:
        """Each failed set landed here since the last call, through `report` (raises the first by
        default); no collective: after every set landed (wait), when every rank holds the same."""
        self._raise(self._errors.take_local())

    def raise_agreed(self) -> None:
        """Every rank, at one call each makes (the next save): each set that failed on any rank,
        through `report` on every rank alike (fastckpt.commit.agreed_errors) — never on one rank
        while another goes on into its framework's next collective."""
        self._raise(self._errors.agreed())

    def _raise(self, errors: list) -> None:
        report_each(errors, self._report)

    def close(self) -> None:
        """Every set committed (or failed: raises the first failure) and its commit thread done."""
        try:
            self.wait()
        finally:
            self._commits.join()

    # -- withdrawing -----------------------------------------------------
    def withdraw(self, owner: str) -> bool:
        """owner is being removed: False if no set of it is in flight here (the caller deletes it
        now); otherwise its sets in flight are not committed, their failures are no error, and
        it is deleted here once the last of them lands."""
        key = os.path.abspath(owner)
        with self._cv:
            if not self._owners.get(key):
                return False
            self._withdrawn.add(key)
            return True

    def is_withdrawn(self, owner: str) -> bool:
        with self._cv:
            return os.path.abspath(owner) in self._withdrawn

    # -- the commit thread's side ------------------------------------------
    def next_counter(self, parent: str) -> int:
        """The counter of the next record written under parent (rank 0, commit thread)."""
        key = os.path.abspath(parent)
        counter = self._counters.get(key) or self._newest_counter(key) + 1
        self._counters[key] = counter + 1
        return counter

    def _newest_record(self, parent: str) -> int:
        return CommittedUnder(parent).next_counter() - 1

    def landed(self, directory: str, error: Optional[BaseException], seq: int = 0) -> None:
        """One set landed (seq: its place in the order sets were submitted); the last one of a
        withdrawn owner deletes it before anyone waiting for that owner is woken."""
        key = _owner(directory)
        with self._cv:
            withdrawn = key in self._withdrawn
            if error is not None and not withdrawn:
                self._errors.landed(seq, error)
            remove = withdrawn and self._owners[key] == 1
        if remove:
            shutil.rmtree(key, ignore_errors=True)
        with self._cv:
            self._owners[key] -= 1
            if not self._owners[key]:
                del self._owners[key]
                self._withdrawn.discard(key)
            self._cv.notify_all()


class FileSetCommit(CommitUnit):
    """One set: this rank's files of it, each a fastckpt save in flight."""

    def __init__(self, sets: FileSets, directory: str, files: list, step: int, fmt: str, meta: Optional[dict],
                 label: Optional[str], seq: int = 0):
        self.sets, self.directory, self.files, self.seq = sets, os.path.abspath(directory), files, seq
        self.step, self.format, self.meta = step, fmt, dict(meta or {})
        self.label = label or f"the checkpoint in {directory}"

    def finish(self) -> list:
        s = self.sets
        mine, error = [], None
        for path, pending in self.files:
            try:
                s.deadline.wait(f"{path} of {self.label}", pending.wait_done, slack=s.slack_s)
                info = pending.wait()
                # behind a memory tier: the set's record vouches for files at their paths, so it waits
                # until each was persisted there (not only committed in memory)
                s.deadline.wait(f"{path} of {self.label}, persisted", pending.wait_placed, slack=s.slack_s)
                pending.raise_placed()
                if os.path.dirname(os.path.abspath(path)) != self.directory:
                    raise CheckpointWriteError(f"{path} is not a file of {self.directory}")
                if s.on_durable is not None:
                    s.on_durable(path)
                f = info.files[0]
                mine.append(FileEntry(os.path.basename(path), s.agreement.rank, info.bytes, f.crc32, f.spans,
                                      f.records))
            except BaseException as e:  # noqa: BLE001 - every file is waited for; the first error counts
                error = error or e
        if error is not None:
            raise CheckpointWriteError(f"{self.label} failed on this rank ({error}); "
                                       "the previous committed checkpoint is intact") from error
        return mine

    def record(self, parts: list, rank: int) -> Optional[CommitInfo]:
        s = self.sets
        if s.is_withdrawn(os.path.dirname(self.directory)):
            return None
        files = tuple(f for part in parts for f in part)
        if not files:  # no rank saved a file into it (DeepSpeed's save_16bit_model): nothing to commit
            return None
        counter = s.next_counter(os.path.dirname(self.directory)) if rank == 0 else 0  # rank 0's record holds it
        info = CommitInfo(step=self.step, path=self.directory, bytes=sum(f.bytes for f in files), counter=counter,
                          time=time.time(), world_size=s.agreement.world_size, format=self.format, files=files,
                          meta=self.meta)
        if rank == 0:
            commit.write(info)
            if s.after_record is not None:
                s.after_record(info)
        return info

    def landed(self, info, error) -> None:
        if self.sets.committed is not None:  # every set, on every rank: the same turns for what follows
            try:
                self.sets.committed(info if error is None else None, self.directory)
            except Exception as e:  # noqa: BLE001 - the set landed: what follows it is not its failure
                log.warning("fastckpt: %s landed, but handing it on failed: %s", self.label, e)
        self.sets.landed(self.directory, error, self.seq)


def _owner(directory: str) -> str:
    return os.path.dirname(os.path.abspath(directory))


class GatheredCommit(CommitUnit):
    """A set whose framework gathered every rank's files on one coordinator, each known durable
    (DCP's finish): the coordinator alone commits it, so it is a unit of one rank whose part is
    every file. part(): the coordinator's own files made durable (1), returning every entry."""

    def __init__(self, directory: str, part: Callable[[], list], step: int, world_size: int,
                 fmt: str, meta: Optional[dict], write: Optional[Callable[[CommitInfo], CommitInfo]] = None):
        self.directory, self._part, self._write = directory if write else os.path.abspath(directory), part, write
        self.step, self.world_size, self.format, self.meta = step, world_size, fmt, dict(meta or {})
        self.label = f"the checkpoint in {directory}"
        self._done = threading.Event()
        self._info: Optional[CommitInfo] = None
        self._error: Optional[BaseException] = None

    def finish(self) -> tuple:
        return tuple(self._part())

    def record(self, parts: list, rank: int) -> CommitInfo:
        files = parts[0]  # the one rank of this unit: the coordinator, holding every rank's files
        if self._write is not None:
            return self._write(CommitInfo(step=self.step, path=self.directory, bytes=sum(f.bytes for f in files),
                                          counter=0, time=time.time(), world_size=self.world_size, format=self.format,
                                          files=files, meta=self.meta))
        with _counting:  # two writers' commits under one parent never take the same counter
            counter = CommittedUnder(os.path.dirname(self.directory)).next_counter()
            info = CommitInfo(step=self.step, path=self.directory, bytes=sum(f.bytes for f in files),
                              counter=counter, time=time.time(), world_size=self.world_size, format=self.format,
                              files=files, meta=self.meta)
            commit.write(info)
        return info

    def landed(self, info, error) -> None:
        self._info, self._error = info, error
        self._done.set()

    def result(self) -> CommitInfo:
        """Waits until it landed: its CommitInfo, or raises why it was not committed."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._info
