"""The checkpoints a Checkpointer has issued and not yet committed, and the errors nobody saw.

Owns the bookkeeping of the commit threads: which checkpoints are in flight (oldest first),
which directories they write into (retention must not touch those), waiting for all of them
and for their copies under the Checkpointer's deadline; a failed checkpoint whose error no caller
has observed is handed to the Checkpointer's errors (fastckpt.commit.agreed_errors: raised by
the next save, wait or close). One checkpoint's handle:
fastckpt.pending.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from ..pending import Pending
from ..workers import Task
from ..write import Deadline, WriteStalled
from .agreed_errors import AgreedErrors


class InFlight:
    def __init__(self, deadline: Deadline, commit_timeout_s: float, errors: AgreedErrors):
        """errors: where a failed checkpoint nobody observed goes (by counter), for its owner to raise."""
        self._deadline, self._slack, self._errors = deadline, commit_timeout_s, errors
        self._lock = threading.Lock()
        self._by_counter: dict[int, tuple[Pending, str, Task]] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_counter)

    def add(self, pending: Pending, ckpt_id: Optional[str], thread: Task) -> None:
        with self._lock:
            self._by_counter[pending.counter] = (pending, ckpt_id, thread)

    def landed(self, pending: Pending) -> None:
        """Its commit thread is done; a failure nobody observed is handed to the owner's errors
        (raised unless a caller observes it first: its Pending's wait())."""
        if pending.error is not None and not pending.observed:  # recorded before it leaves the in-flight list
            self._errors.landed((0, pending.counter), pending.error, seen=lambda: pending.observed)
        with self._lock:
            self._by_counter.pop(pending.counter, None)

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

    def wait_copied(self, timeout: Optional[float] = None,
                    waited: Optional[Callable[[Pending, float], None]] = None) -> Optional[WriteStalled]:
        """Until every snapshot in flight has copied the caller's tensors. A copy that stalls
        abandons its checkpoint (its tensors are free again) and is returned; a failed write is
        left to its commit thread to report. waited(pending, seconds): how long each one took."""
        stalled = None
        for p in self.pendings():
            p.release_all()
            t = time.monotonic()
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
            finally:
                if waited is not None:
                    waited(p, time.monotonic() - t)
            if not copied:
                raise TimeoutError(f"snapshot of step {p.step} still copying after {timeout}s")
        return stalled

