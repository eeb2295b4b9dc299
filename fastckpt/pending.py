"""Pending: the handle save() returns for one checkpoint in flight (the set of them:
fastckpt.commit.in_flight)."""
from __future__ import annotations

import threading
import time

from typing import Any, Iterable, Optional

from .commit_info import CommitInfo
from .format.plan import FilePlan
from .timings import Timings


class Pending:
    """A checkpoint being taken. done() / wait() -> CommitInfo; copied() for the gate."""

    def __init__(self, step: int, counter: int, skipped: bool = False, clock: Timings | None = None,
                 t0: float | None = None, placed_later: bool = False):
        """clock, t0: the phases timed so far, and when save() was called (time.monotonic());
        placed_later: its owner says when it is placed (a copy behind a memory tier may follow its
        commit), not its commit."""
        self.step, self.counter = step, counter
        self.clock = clock if clock is not None else Timings()
        self.t0 = time.monotonic() if t0 is None else t0
        self._copied = threading.Event()
        self._done = threading.Event()
        self._placed = threading.Event()  # durable where it was asked for (behind a memory tier: persisted)
        self._placed_error: BaseException | None = None
        self._placed_later = placed_later
        self._info: CommitInfo | None = None
        self._error: BaseException | None = None
        self.observed = False
        self.placed_observed = False  # a caller was given why it was not placed (raise_placed)
        self.skipped = skipped
        self.write: Any = None  # the SnapshotWrite in flight (None when skipped or failed to start)
        self.plan: Optional[FilePlan] = None  # plan.records are what release()/wait_records() index
        self.watch: Any = None  # a write.watch.SnapshotWatch over tensors copied after save() returned, if any
        self.strategy: Optional[str] = None  # what it was written with (the Checkpointer's may change it: see stats)
        self.mode: Optional[str] = None  # how its bytes moved (its write's mode), once started
        self._index: dict[int, int] | None = None
        if skipped:
            self._copied.set()
            self._done.set()
            self._placed.set()

    @property
    def timings(self) -> dict[str, float]:
        """Where this save's time went, in seconds (fastckpt.timings names every phase); the
        write's own phases are in once it landed, instants counted from the save() call."""
        return self.clock.as_dict(since=self.t0)

    def done(self) -> bool:
        """True once the checkpoint is committed, failed, or was skipped."""
        return self._done.is_set()

    def copied(self) -> bool:
        """True once the snapshot no longer reads the caller's tensors."""
        if self.write is None or self._done.is_set():
            return self._copied.is_set()
        return self.write.copied()

    def wait_copied(self, timeout: float | None = None) -> bool:
        """True once the snapshot no longer reads the caller's tensors (False after `timeout`);
        raises the write's error, or WriteStalled when its copy made no progress for the deadline."""
        if self.write is None or self._done.is_set():
            return self._copied.wait(timeout)
        with self.clock.phase("gate"):
            return self.write.wait_copied(timeout)

    def record_index(self) -> dict[int, int]:
        """Storage (data_ptr) -> index of the record that copies it; built once."""
        if self._index is None:
            records = self.plan.records if self.plan is not None else []
            self._index = {r.storage.data_ptr(): i for i, r in enumerate(records)}
        return self._index

    def records_of(self, storages: Iterable[int]) -> list[int]:
        """Indices of the records copying these storages (those this checkpoint holds)."""
        index = self.record_index()
        return [index[s] for s in storages if s in index]

    def release(self, records: list[int]) -> None:
        """Held saves: let the copy of these records start now."""
        if self.write is not None and not self._done.is_set():
            self.write.release(records)

    def release_all(self) -> None:
        if self.write is not None and not self._done.is_set():
            self.write.release_all()

    def wait_records(self, records: list[int], timeout: float | None = None) -> bool:
        """True once these records are copied: their tensors may change again. A write that
        failed or stalled is aborted here (so nothing reads them any more); its commit thread
        reports the error through wait() and the next save."""
        if self.write is None or self._done.is_set():
            return True
        try:
            with self.clock.phase("gate"):
                return self.write.wait_records(records, timeout)
        except Exception as e:  # noqa: BLE001 - reported by the commit thread, see above
            self.write.abort(e)
            return True

    def wait(self, timeout: float | None = None) -> CommitInfo | None:
        """Blocks until committed; returns its CommitInfo (None if skipped) or raises its error."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"checkpoint of step {self.step} still in flight after {timeout}s")
        self.observed = True
        if self._error is not None:
            raise self._error
        return self._info

    @property
    def info(self) -> CommitInfo | None:
        """Its record once committed (None before, and when it failed or was skipped)."""
        return self._info

    @property
    def error(self) -> BaseException | None:
        return self._error

    def wait_done(self, timeout: float | None = None) -> bool:
        """True once committed, failed or skipped (False after `timeout`); raises nothing."""
        return self._done.wait(timeout)

    def placed(self, error: BaseException | None = None) -> None:
        """It is durable where its save asked (its path, its root), or never will be (error): set
        by its owner once it landed, or, behind a memory tier, once its copy there landed."""
        self._placed_error = error
        self._placed.set()

    def wait_placed(self, timeout: float | None = None) -> bool:
        """True once placed (or failed to be); raises nothing (see placed_error)."""
        return self._placed.wait(timeout)

    @property
    def placed_error(self) -> BaseException | None:
        """Why it did not reach where its save asked (None: it did, or not known yet)."""
        return self._placed_error

    def raise_placed(self) -> None:
        """Raises why it did not reach where its save asked, if it did not: its caller reports it
        (a DeepSpeed tag, a DCP checkpoint, a file saved outside a tag), and its owner then does not
        report it again (placed_observed)."""
        if self._placed_error is not None:
            self.placed_observed = True
            raise self._placed_error

    def settle(self, info: CommitInfo | None, error: BaseException | None) -> None:
        """Its commit landed: committed (info) or failed (error). Called once, by the commit."""
        self._info, self._error = info, error
        if error is not None or not self._placed_later:
            self.placed(error)
        self._copied.set()
        self._done.set()

    def __repr__(self) -> str:
        state = "skipped" if self.skipped else "done" if self.done() else "in flight"
        return f"Pending(step={self.step}, counter={self.counter}, {state})"
