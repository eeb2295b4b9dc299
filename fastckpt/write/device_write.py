"""What the device writes share: byte views on a side stream, release order, latches, one worker.

Owns, for writes whose tensors are read through a stream (streams.py):
- the byte views of the plan's records, each cut to its record's length (a pad record's
  source storage is larger than the pad);
- strategy g's copy into spare memory of each tensor's device, issued while save() runs
  (host storages in the plan — Adam's `step` counters — are copied on the host then, so
  nothing is read after the gate); a device short of memory falls back to c;
- `ReleaseOrder`: units (chunks or records) in the order they are released, each with a
  latch set once its tensors are no longer read; waiting for a release is held time (no
  deadline runs: the owner releases at its gate, wait() or close());
- `DeviceWrite`: the bounded waits, abort, and the one worker thread (feeder or drain).
"""
from __future__ import annotations

import abc
import ctypes
import logging
import queue
import threading
from typing import Callable, Optional

import numpy as np
import torch

from .deadline import Deadline
from .job_write import keep_stuck
from .protocol import SnapshotWrite
from .streams import STREAMS, device_type

log = logging.getLogger("fastckpt")


def bytes_of(storage: torch.UntypedStorage, nbytes: int) -> torch.Tensor:
    """The first nbytes of a storage as a uint8 tensor on its device (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)[:nbytes]


def host_view(addr: int, n: int) -> torch.Tensor:
    """n bytes of host memory at a raw address (a staging chunk, a pool) as a uint8 tensor."""
    return torch.from_numpy(np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(addr)))


def new_stream(plan):
    return STREAMS[device_type(plan)](plan)


class DeviceSource:
    """The records of a plan as the stream reads them: views of the live tensors, or (g) copies."""

    def __init__(self, plan, stream, strategy: str):
        self.plan, self.stream = plan, stream
        self.spare_copied: Optional[object] = None  # the Mark of g's copy, once issued
        self._views: list[Optional[torch.Tensor]] = [None] * len(plan.records)
        if strategy == "g":
            self._copy_to_spare()

    def view(self, i: int) -> torch.Tensor:
        if self._views[i] is None:
            r = self.plan.records[i]
            self._views[i] = bytes_of(r.storage, r.nbytes)
        return self._views[i]

    def _copy_to_spare(self) -> None:
        copies: list[torch.Tensor] = []
        for i, r in enumerate(self.plan.records):
            if not r.nbytes:
                copies.append(self.view(i))
            elif r.storage.device.type == "cpu":
                copies.append(self.view(i).clone())  # host storages: now, before the gate
            else:
                buf = self.stream.spare(r.storage.device, r.nbytes)
                if buf is None:
                    log.warning(
                        "fastckpt: strategy 'g' needs %d MiB of spare memory on %s; using 'c' for this "
                        "checkpoint", r.nbytes >> 20, r.storage.device)
                    return  # nothing issued yet is used; the buffers go back to the allocator
                copies.append(buf)
        for i, buf in enumerate(copies):
            if buf.device.type != "cpu" and self.plan.records[i].nbytes:
                self.stream.copy(buf, self.view(i))
        self._views = copies
        self.spare_copied = self.stream.mark()

    def close(self) -> None:
        self._views = [None] * len(self.plan.records)
        self.stream.close()


class ReleaseOrder:
    """Units in the order they are released; done[u] is set once unit u reads no tensor."""

    def __init__(self, n: int, held: bool):
        self.done = [threading.Event() for _ in range(n)]
        self.all_released = threading.Event()
        self._issued = [False] * n
        self._q: "queue.Queue[int]" = queue.Queue()
        self._lock = threading.Lock()
        self._stopped = False
        if not held:
            self.release(range(n))

    def release(self, units) -> None:
        with self._lock:
            for u in units:
                if not self._issued[u]:
                    self._issued[u] = True
                    self._q.put(u)
            if all(self._issued):
                self.all_released.set()

    def next(self, busy: Callable[[], bool]) -> Optional[int]:
        """The next released unit. While none is, busy() finishes work in flight (False when
        there is none); then waits, without a deadline, for a release. None once stopped."""
        while not self._stopped:
            try:
                return self._q.get_nowait()
            except queue.Empty:
                pass
            if busy():
                continue
            try:
                return self._q.get(timeout=0.5)
            except queue.Empty:
                pass
        return None

    def stop(self) -> None:
        """Wakes every waiter (abort): the latches are set, the worker's next() returns None."""
        self._stopped = True
        self.all_released.set()
        for ev in self.done:
            ev.set()


class DeviceWrite(SnapshotWrite):
    """Waits, abort and the worker of a write read through a stream (subclasses: _run, finish)."""

    def __init__(self, engine, plan, sink, strategy: str, deadline: Deadline, stream, where: str):
        self.engine, self.plan, self.sink, self.strategy, self.where = engine, plan, sink, strategy, where
        self.deadline = deadline
        self.source = DeviceSource(plan, stream if stream is not None else new_stream(plan), strategy)
        self._error: BaseException | None = None
        self._moved = 0
        self._thread: Optional[threading.Thread] = None

    def _start(self, name: str) -> None:
        self._thread = threading.Thread(target=self._guarded, name=name, daemon=True)
        self._thread.start()

    def _guarded(self) -> None:
        try:
            self._run()
        except BaseException as e:  # noqa: BLE001 - raised by the waits and by finish()
            self.abort(e)

    @abc.abstractmethod
    def _run(self) -> None:
        """The worker: feeds chunks to the writers, or drains records into the pool."""

    def _moved_one(self) -> None:
        self._moved += 1
        self.deadline.moved()

    # -- bounded waits ------------------------------------------------------
    def _wait_events(self, events, what, timeout: float | None = None) -> bool:
        left = [e for e in events if not e.is_set()]

        def attempt(seconds: float) -> bool:
            while left and left[0].is_set():
                left.pop(0)
            if left:
                left[0].wait(seconds)
            while left and left[0].is_set():
                left.pop(0)
            return not left

        done = self.deadline.wait(what, attempt, timeout) if left else True
        if self._error is not None:
            raise self._error
        return done

    def _wait_mark(self, mark, what) -> None:
        with self.clock.phase("stream_wait"):
            self.deadline.wait(what, mark.wait)

    def _native_timings(self) -> dict[str, float]:
        job = getattr(self, "_job", None)  # its copied_at means nothing here: the feeder hands over filled chunks
        return {k: v for k, v in job.timings() if k != "copied_at"} if job is not None else {}

    def _finish_worker(self, released: threading.Event) -> None:
        """Held time (no deadline) until everything is released, then the worker's end (under it)."""
        while not released.wait(1.0):
            if self._error is not None:
                raise self._error
        # slack: the worker's own waits have the same deadline and name what they waited for
        self.deadline.wait(lambda: f"the copy and write of {self.where} ({self._moved} units done)",
                           lambda s: (self._thread.join(s), not self._thread.is_alive())[1],
                           slack=self.deadline.stall_s)
        if self._error is not None:
            raise self._error

    # -- (4) abort ----------------------------------------------------------
    def _stop(self, timeout: float) -> bool:
        """Stops what the subclass runs besides the worker; True once it has stopped (waiting
        up to `timeout` seconds for that)."""
        return True

    def abort(self, error: BaseException) -> bool:
        if self._error is None:
            self._error = error
        self.units.stop()
        ok = self._stop(self.deadline.stall_s)
        worker = self._thread
        if worker is not None and worker is not threading.current_thread():
            worker.join(self.deadline.stall_s)
            ok = ok and not worker.is_alive()
        if not ok:
            keep_stuck(self, f"the write of {self.where} did not stop within {self.deadline.stall_s:g} s")
        else:
            self.source.close()
            self._let_go()
        return ok

    def settled(self) -> bool:
        """True once the worker (and what _stop waits for) of this aborted write has ended."""
        return (self._thread is None or not self._thread.is_alive()) and self._stop(0.0)

    def copied(self) -> bool:
        return self._error is not None or all(e.is_set() for e in self._gate_latches(None, release=False))

    @abc.abstractmethod
    def _gate_latches(self, records, release: bool = True):
        """The events that say these records (None: all) are no longer read; release them first."""

    def wait_records(self, records, timeout: float | None = None) -> bool:
        records = list(records)
        if not records:
            return True
        return self._wait_events(self._gate_latches(records), f"the copy of {len(records)} record(s) for "
                                 f"{self.where}", timeout)

    def wait_copied(self, timeout: float | None = None) -> bool:
        self.release_all()
        return self._wait_events(self._gate_latches(None), f"the copy for {self.where}", timeout)

