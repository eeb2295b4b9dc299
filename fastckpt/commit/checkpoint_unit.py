"""CheckpointCommit: one Checkpointer checkpoint as a unit of the ordered commit.

Owns what is particular to a Checkpointer checkpoint on its way to commit (when each step
runs is fastckpt.commit.ordered's business): finishing its file through the store; dropping it
when a tensor was written in place before its snapshot copied it (SnapshotWatch); the rename
into place, in counter order, since a later save of the same path must land last; the COMMIT
record (every rank's FileEntry; `store.commit_rank` on every rank, `store.commit` on rank 0);
and on landing its Pending, the cleanup of a failed checkpoint, and afterwards retention and the
next part's file made ahead (store.make_ahead).
"""
from __future__ import annotations

import logging
import os
import time
import warnings
from typing import Callable, Optional

from ..errors import CheckpointWriteError, TornSnapshotError
from ..pending import Pending
from .protocol import CommitUnit
from ..commit_info import CommitInfo, FileEntry

log = logging.getLogger("fastckpt")


class CheckpointCommit(CommitUnit):
    """Args: store, the checkpoint's Pending (its write and watch), where it was begun
    (ckpt_id, file_path: what store.begin returned), the caller's meta, the Checkpointer's
    format, rank and world size; landed(pending): the Checkpointer's own bookkeeping once it
    landed; retain(): retention, run after a commit; written(result): the WriteResult of its
    file once durable (how its bytes went: O_DIRECT or buffered)."""

    def __init__(self, store, pending: Pending, ckpt_id: Optional[str], file_path: Optional[str], meta, fmt: str,
                 rank: int, world_size: int, landed: Callable[[Pending], None], retain: Callable[[], None],
                 written: Callable[[object], None] = lambda result: None):
        self.store, self.pending, self.ckpt_id, self.file_path = store, pending, ckpt_id, file_path
        self.meta, self.format, self.rank, self.world_size = meta, fmt, rank, world_size
        self._landed, self._retain, self._written = landed, retain, written
        self.label = f"step {pending.step}"
        self.stuck = False  # the write could not be aborted: its file stays open (see store.abort)

    def finish(self):
        write = self.pending.write
        try:
            result = self.store.finish_write(write, self.file_path)
        except BaseException as e:
            self.stuck = not write.abort(e)
            raise
        self._written(result)
        return result

    def timed(self, phase: str, seconds: float) -> None:
        self.pending.clock.add(phase, seconds)

    def in_order(self, result) -> FileEntry:
        watch = self.pending.watch
        if watch is not None and watch.deferred:
            changed = watch.check()  # the copies are done; the gate may have decided already
            if changed:
                error = TornSnapshotError(
                    f"{changed} was written in place after save() returned and before its snapshot was copied "
                    f"(not by the optimizer); the checkpoint of step {self.pending.step} could mix two states and "
                    "was dropped; later snapshots are copied before save() returns")
                self.pending.observed = True  # warned about here, whatever on_error says
                log.warning("fastckpt: %s", error)
                warnings.warn(f"fastckpt: {error}", stacklevel=1)
                raise error
        result.path = self.store.commit_file(self.ckpt_id, self.file_path, result)
        return FileEntry(os.path.basename(result.path), self.rank, result.bytes, result.file_crc,
                         [list(s) for s in result.spans], result.names or [], result.etag)

    def record(self, parts: list, rank: int) -> CommitInfo:
        p = self.pending
        info = CommitInfo(step=p.step, path=self.ckpt_id, bytes=sum(e.bytes for e in parts), counter=p.counter,
                          time=time.time(), world_size=self.world_size, format=self.format, files=tuple(parts),
                          meta=self.meta or {})
        self.store.commit_rank(self.ckpt_id, info)
        if rank == 0:
            try:
                self.store.commit(info)
            except OSError as e:
                raise CheckpointWriteError(f"writing the commit record of step {p.step} failed: {e}; "
                                           "the previous checkpoint stays the latest") from e
        return info

    def landed(self, info, error) -> None:
        if error is not None:
            error = as_write_error(error, self.pending.step)
            try:
                self.store.abort(self.ckpt_id, self.file_path, self.rank, stuck=self.stuck)
            except BaseException as e:  # noqa: BLE001 - a read-only or dead disk cannot be cleaned; the commit must end
                log.warning("fastckpt: could not remove the failed checkpoint of step %s: %s", self.pending.step, e)
        clock = self.pending.clock
        if self.pending.write is not None:
            clock.take(self.pending.write.timings())
        clock.at("durable_at")
        self.pending.settle(info if error is None else None, error)
        self._landed(self.pending)

    def afterwards(self) -> None:
        if self.pending.error is None:
            self._retain()
            if self.pending.plan is not None:  # the next part's file, about this one's size
                self.store.make_ahead(self.rank, self.format, self.pending.plan.file_size)


def as_write_error(e: BaseException, step: int) -> BaseException:
    """An OSError of a checkpoint's write, as the CheckpointWriteError callers catch."""
    if isinstance(e, OSError) and not isinstance(e, CheckpointWriteError):
        return CheckpointWriteError(f"checkpoint of step {step} failed: {e}; the previous checkpoint is intact")
    return e
