"""What the host writes share: one native WriteJob driven through the write protocol.

Owns release, the bounded waits (each native wait runs in slices under the write's
Deadline and names the job's state when it stalls), the held-time wait before finishing
(a held write waits for its owner to release it: that time is the owner's, not the write
path's, and no deadline runs during it), abort (the native job stops its tasks; one stuck in
the kernel is reported and its engine kept alive) and progress; and `finalized`, how any write
of a file through a native job (the device writes' too) ends: headers, then fdatasync.
"""
from __future__ import annotations

import atexit
import ctypes
import logging
import threading

from .deadline import Deadline
from .protocol import SnapshotWrite

log = logging.getLogger("fastckpt")
STUCK: list = []  # writes whose tasks would not stop: they (and their engines) outlive their owners


def keep_stuck(write, why: str) -> None:
    """A write whose workers did not stop by the deadline: logged, and kept alive until they
    do (destroying its engine would join a thread blocked in the kernel)."""
    log.error("fastckpt: %s; its threads are left to finish on their own", why)
    STUCK.append(write)


@atexit.register
def _never_destroy_stuck() -> None:
    """At exit, a write still stuck keeps its engine for good: tearing the interpreter down
    would destroy the engine, and its destructor would join a thread blocked in the kernel —
    a hang at exit. The reference is leaked on purpose; exit ends those threads."""
    for w in STUCK:
        if not w.settled():
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(w))


def finalized(job, plan, wait) -> tuple[list[int], list, int]:
    """A native job's file finished, for every write of a file through one (host and device): its
    headers built once every CRC is known (a staged job sums each chunk beside its put, so while
    the writers still put the last chunks), then written, the file truncated and fdatasync'ed,
    once every data byte is in. wait(latch, what): the caller's bounded wait on one of the job's
    latches. Returns (the records' CRCs, the header blobs, the file's CRC)."""
    wait(job.wait_summed, "the CRCs")
    crcs = list(job.record_crcs())
    blobs, file_crc = plan.finish(crcs)
    wait(job.wait_written, "the writers")
    job.finalize(blobs, plan.file_size)
    return crcs, blobs, file_crc


def stuck_on(engine) -> bool:
    """Whether a stuck write of this engine still has a worker running (settled ones are dropped)."""
    STUCK[:] = [w for w in STUCK if not w.settled()]
    return any(w.engine is engine for w in STUCK)


class JobWrite(SnapshotWrite):
    """A write whose bytes move by one native job (set self._job in the subclass)."""

    def __init__(self, engine, plan, deadline: Deadline, where: str, held: bool):
        self.engine, self.plan, self.deadline, self.where = engine, plan, deadline, where
        self._job = None
        self._error: BaseException | None = None
        self._released = threading.Event()
        if not held:
            self._released.set()

    # -- (1) release ----------------------------------------------------
    def release(self, records) -> None:
        if self._job is not None and not self._released.is_set():
            self._job.release(list(records))

    def release_all(self) -> None:
        if self._job is not None and not self._released.is_set():
            self._job.release_all()
        self._released.set()

    # -- (2) the gate -----------------------------------------------------
    def wait_records(self, records, timeout: float | None = None) -> bool:
        records = list(records)
        if not records:
            return True
        self.release(records)
        return self._wait(lambda s: self._job.wait_records_copied(records, s),
                          f"the copy of {len(records)} record(s) for {self.where}", timeout)

    def wait_copied(self, timeout: float | None = None) -> bool:
        self.release_all()
        return self._wait(self._job.wait_copied, f"the copy for {self.where}", timeout)

    def _wait(self, attempt, what: str, timeout: float | None) -> bool:
        if self._error is not None:
            raise self._error
        try:
            return self.deadline.wait(lambda: f"{what} ({self._job.status()})", attempt, timeout)
        except Exception:
            if self._error is not None:  # aborted: its error, not the job's echo of it
                raise self._error from None
            raise

    # -- (3) finishing ----------------------------------------------------
    def _wait_released(self) -> None:
        """Held time: until its owner released every record (no deadline runs during it)."""
        while not self._released.wait(1.0):
            if self._error is not None:
                raise self._error

    def _wait_written(self) -> None:
        """Held time first, then every data byte in the sink (under the deadline)."""
        self._wait_released()
        self._wait(self._job.wait_written, f"the writers of {self.where}", None)

    # -- (4) abort --------------------------------------------------------
    def abort(self, error: BaseException) -> bool:
        if self._error is None:
            self._error = error
        self._released.set()
        if self._job is None:
            self._let_go()
            return True
        if self._job.abort(str(error), self.deadline.stall_s):
            self._let_go()
            return True
        keep_stuck(self, f"the write of {self.where} did not stop within {self.deadline.stall_s:g} s "
                         f"({self._job.status()})")
        return False

    def settled(self) -> bool:
        """True once no task of this (aborted) write runs any more."""
        return self._job is None or self._job.abort(str(self._error), 0.0)

    @property
    def bytes_written(self) -> int:
        return self._job.bytes_written if self._job is not None else 0

    def _native_timings(self) -> dict[str, float]:
        return dict(self._job.timings()) if self._job is not None else {}

    def copied(self) -> bool:
        try:
            return self._error is not None or self._job.wait_copied(0.0)
        except Exception:  # noqa: BLE001 - a failed job reads nothing more
            return True
