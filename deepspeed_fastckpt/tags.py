"""Tag-level commit of a DeepSpeed checkpoint: each tag is one unit of fastckpt's ordered
commit (fastckpt.commit.ordered). A tag finishes once this rank's files of it are durable and
commits in the order tags were saved, once every rank's files are; rank 0 then writes the
tag's record and `fastckpt-latest` (the format and its readers: fastckpt.store.tag_records).
A save_dir withdrawn while tags of it are in flight (its owner removed it: Lightning's
ModelCheckpoint dropping a checkpoint it no longer keeps) is deleted once they land, and
they are not committed.
"""
from __future__ import annotations

import os
import shutil
import threading
from typing import Callable, Optional

from fastckpt.commit.agreement import make_agreement
from fastckpt.commit.ordered import CommitUnit, OrderedCommits
from fastckpt.config import DEFAULTS
from fastckpt.errors import CheckpointWriteError
from fastckpt.named import NamedCheckpoints
from fastckpt.store.tag_records import next_seq, write_record
from fastckpt.write.deadline import Deadline


class TagCommitter:
    """Commits the tags one engine saves through `named`, in the order they were saved, on every rank.

    report(error): what a failed tag does to the training thread (default: raise it).
    """

    def __init__(self, named: NamedCheckpoints, report: Optional[Callable[[BaseException], None]] = None):
        self.slack_s = named.settings.get("commit_timeout_s", DEFAULTS.commit_timeout_s)
        self.agreement = make_agreement(self.slack_s)
        self.deadline = Deadline(named.settings.get("stall_timeout_s", DEFAULTS.stall_timeout_s), named.progress)
        self._commits = OrderedCommits(self.agreement, self.deadline, self.slack_s, name="fastckpt-tag")
        self.on_durable = named.leave_pointer if named.pool else None  # a pointer file where DeepSpeed looks
        self._report = report
        self._cv = threading.Condition()
        self._errors: list[BaseException] = []
        self._dirs: dict[str, int] = {}  # save_dir -> tags of it in flight
        self._withdrawn: set[str] = set()  # save_dirs to delete once their tags land
        self._seq: dict[str, int] = {}

    def submit(self, save_dir: str, tag: str, files: list) -> None:
        """files: [(path, Pending)] this rank wrote for the tag."""
        with self._cv:
            key = os.path.abspath(save_dir)
            self._dirs[key] = self._dirs.get(key, 0) + 1
        self._commits.issue(TagCommit(self, save_dir, tag, files))

    def wait_for(self, save_dir: str) -> None:
        """Until no tag of save_dir is in flight here (committed or failed); raises nothing
        but WriteStalled."""
        key = os.path.abspath(save_dir)
        self._until(f"the tags in flight of {save_dir}", lambda: self._dirs.get(key, 0) == 0)

    def withdraw(self, save_dir: str) -> bool:
        """save_dir is removed by its owner: False if no tag of it is in flight here (the
        caller deletes it now); otherwise its tags in flight are not committed, their failures
        are no error, and the committer deletes save_dir once the last of them lands."""
        key = os.path.abspath(save_dir)
        with self._cv:
            if not self._dirs.get(key):
                return False
            self._withdrawn.add(key)
            return True

    def is_withdrawn(self, save_dir: str) -> bool:
        with self._cv:
            return os.path.abspath(save_dir) in self._withdrawn

    def wait(self) -> None:
        """Until every submitted tag is committed (or failed); raises the first failure."""
        self._until("the tags in flight", lambda: not self._dirs)
        self.raise_errors()

    def _until(self, what: str, condition: Callable[[], bool]) -> None:
        def attempt(seconds: float) -> bool:
            with self._cv:
                return self._cv.wait_for(condition, seconds)
        self.deadline.wait(what, attempt, slack=self.slack_s)

    def raise_errors(self) -> None:
        """Each failed tag since the last call, through `report` (raises the first by default)."""
        with self._cv:
            errors, self._errors = self._errors, []
        for e in errors:
            if self._report is None:
                raise e
            self._report(e)

    def close(self) -> None:
        self.wait()

    def next_seq(self, save_dir: str) -> int:
        """The sequence number of the next tag committed into save_dir (rank 0)."""
        seq = self._seq.get(save_dir) or next_seq(save_dir)
        self._seq[save_dir] = seq + 1
        return seq

    def landed(self, save_dir: str, error: Optional[BaseException]) -> None:
        """One tag of save_dir landed; the last of a withdrawn save_dir deletes it before
        anyone waiting for that save_dir is woken."""
        key = os.path.abspath(save_dir)
        with self._cv:
            withdrawn = key in self._withdrawn
            if error is not None and not withdrawn:
                self._errors.append(error)
            remove = withdrawn and self._dirs[key] == 1
        if remove:
            shutil.rmtree(key, ignore_errors=True)
        with self._cv:
            self._dirs[key] -= 1
            if not self._dirs[key]:
                del self._dirs[key]
                self._withdrawn.discard(key)
            self._cv.notify_all()


class TagCommit(CommitUnit):
    """One tag: this rank's files of it, each a fastckpt save in flight."""

    def __init__(self, committer: TagCommitter, save_dir: str, tag: str, files: list):
        self.committer, self.save_dir, self.tag, self.files = committer, save_dir, tag, files
        self.label = f"tag {tag!r} in {save_dir}"

    def finish(self) -> list:
        c = self.committer
        mine, error = [], None
        for path, pending in self.files:
            try:
                c.deadline.wait(f"{path} of {self.label}", pending.wait_done, slack=c.slack_s)
                info = pending.wait()
                if c.on_durable is not None:
                    c.on_durable(path)
                mine.append({"name": os.path.relpath(path, os.path.join(self.save_dir, self.tag)),
                             "bytes": info.bytes, "crc32": f"{info.files[0].crc32:08x}"})
            except BaseException as e:  # noqa: BLE001 - every file is waited for; the first error counts
                error = error or e
        if error is not None:
            raise CheckpointWriteError(f"checkpoint {self.label} failed on this rank ({error}); "
                                       "the previous committed tag is intact") from error
        return mine

    def record(self, parts: list, rank: int) -> None:
        if rank == 0 and not self.committer.is_withdrawn(self.save_dir):
            write_record(self.save_dir, self.tag, self.committer.next_seq(self.save_dir),
                         self.committer.agreement.world_size, [f for files in parts for f in files])

    def landed(self, info, error) -> None:
        self.committer.landed(self.save_dir, error)
