"""Checkpoints in flight: Pending, the handle save() returns for one, and InFlight, the set a
Checkpointer has issued and not yet committed.

InFlight owns the bookkeeping of the commit threads: which checkpoints are in flight (oldest
first), which directories they write into (retention must not touch those), waiting for all of
them and for their copies under the Checkpointer's deadline, and the failed checkpoints whose
error no caller has observed yet (raised by the next save, wait or close).
"""
from __future__ import annotations

import threading
from typing import Optional

from .commit.record import CommitInfo
from .write import Deadline, WriteStalled


class Pending:
    """A checkpoint being taken. done() / wait() -> CommitInfo; copied() for the gate."""

    def __init__(self, step: int, counter: int, skipped: bool = False):
        self.step, self.counter = step, counter
        self._copied = threading.Event()
        self._done = threading.Event()
        self._info: CommitInfo | None = None
        self._error: BaseException | None = None
        self.observed = False
        self.skipped = skipped
        self.write = None  # the SnapshotWrite in flight (None when skipped or failed to start)
        self.plan = None   # the FilePlan: plan.records are what release()/wait_records() index
        self.watch = None  # the SnapshotWatch over tensors copied after save() returned, if any
        self.strategy = None  # the strategy it was written with (the Checkpointer's may change it: see stats)
        self.mode = None  # how its bytes moved (its write's mode), once started
        self._index: dict[int, int] | None = None
        if skipped:
            self._copied.set()
            self._done.set()

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
        return self.write.wait_copied(timeout)

    def record_index(self) -> dict[int, int]:
        """Storage (data_ptr) -> index of the record that copies it; built once."""
        if self._index is None:
            records = self.plan.records if self.plan is not None else []
            self._index = {r.storage.data_ptr(): i for i, r in enumerate(records)}
        return self._index

    def records_of(self, storages) -> list[int]:
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
    def error(self) -> BaseException | None:
        return self._error

    def wait_done(self, timeout: float | None = None) -> bool:
        """True once committed, failed or skipped (False after `timeout`); raises nothing."""
        return self._done.wait(timeout)

    def settle(self, info: CommitInfo | None, error: BaseException | None) -> None:
        """Its commit landed: committed (info) or failed (error). Called once, by the commit."""
        self._info, self._error = info, error
        self._copied.set()
        self._done.set()

    def __repr__(self) -> str:
        state = "skipped" if self.skipped else "done" if self.done() else "in flight"
        return f"Pending(step={self.step}, counter={self.counter}, {state})"


class InFlight:
    def __init__(self, deadline: Deadline, commit_timeout_s: float):
        self._deadline, self._slack = deadline, commit_timeout_s
        self._lock = threading.Lock()
        self._by_counter: dict[int, tuple[Pending, str, threading.Thread]] = {}
        self._unobserved: list[Pending] = []

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_counter)

    def add(self, pending: Pending, ckpt_id: str, thread: threading.Thread) -> None:
        with self._lock:
            self._by_counter[pending.counter] = (pending, ckpt_id, thread)

    def landed(self, pending: Pending) -> None:
        """Its commit thread is done; a failure nobody observed is kept for unseen_errors()."""
        with self._lock:
            self._by_counter.pop(pending.counter, None)
            if pending.error is not None and not pending.observed:
                self._unobserved.append(pending)

    def pendings(self) -> list[Pending]:
        """Oldest first."""
        with self._lock:
            return [p for (p, _, _) in sorted(self._by_counter.values(), key=lambda v: v[0].counter)]

    def directories(self) -> set[str]:
        with self._lock:
            return {d for (_, d, _) in self._by_counter.values()}

    def wait(self) -> None:
        """Until every commit thread has ended (each wait bounded by the deadline)."""
        while True:
            with self._lock:
                items = list(self._by_counter.values())
            if not items:
                return
            for pending, _, thread in items:
                pending.release_all()
                self._deadline.wait(f"the commit of step {pending.step}",
                                    lambda s: (thread.join(s), not thread.is_alive())[1], slack=self._slack)

    def wait_copied(self, timeout: Optional[float] = None) -> Optional[WriteStalled]:
        """Until every snapshot in flight has copied the caller's tensors. A copy that stalls
        abandons its checkpoint (its tensors are free again) and is returned; a failed write is
        left to its commit thread to report."""
        stalled = None
        for p in self.pendings():
            p.release_all()
            try:
                copied = p.wait_copied(timeout)
            except WriteStalled as e:
                p.write.abort(e)
                p.observed = True
                stalled = stalled or e
                continue
            except Exception as e:  # noqa: BLE001 - a failed write: its commit thread reports it
                p.write.abort(e)
                continue
            if not copied:
                raise TimeoutError(f"snapshot of step {p.step} still copying after {timeout}s")
        return stalled

    def unseen_errors(self) -> list[BaseException]:
        """Errors of failed checkpoints no caller has observed; each is returned once."""
        with self._lock:
            errs, self._unobserved = [p for p in self._unobserved if not p.observed], []
        for p in errs:
            p.observed = True
        return [p.error for p in errs]
