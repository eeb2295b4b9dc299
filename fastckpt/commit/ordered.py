"""The ordered commit: each checkpoint becomes real after the one issued before it, and only
once every rank's part of it is durable.

Owns the one mechanism every kind of checkpoint commits through: the Checkpointer's (one file
per rank, a COMMIT record: fastckpt.commit.checkpoint_unit), a set of files across ranks
(DeepSpeed's tags: fastckpt.commit.file_sets.FileSetCommit) and a set its framework gathered on
one coordinator (DCP's finish: fastckpt.commit.file_sets.GatheredCommit). A unit of commit
(fastckpt.commit.protocol.CommitUnit, its calls numbered there) says what its part is and how
its record is written; this module says when:

  1. `finish()` on the unit's own thread, at once: this rank's part, durable. Units issued
     one after another finish in parallel (PCcheck's concurrent checkpoints).
  2. wait, under the write path's Deadline, until the unit issued before it has landed;
  3. `in_order(finished)`: what must follow the previous unit (a rename over the same path);
     it returns this rank's part of the record;
  4. the ranks exchange (ok, part) — one gather on the agreement's background group, made in
     issue order on every rank, so the collectives of consecutive units never interleave (a
     unit whose predecessor stalled past the deadline on a multi-rank job therefore makes no
     collective at all: it fails, and so does every unit issued after it, while those issued
     before it still commit with their peers);
  5. if every rank's part is there, `record(parts)` on every rank (rank 0 writes the record
     whose durable presence makes the checkpoint real), and the ranks agree it held;
  6. `landed(info, error)` exactly once: committed, or failed with the first error (this
     rank's own, or "another rank failed"); then the next unit may commit; then `afterwards()`
     (retention: deleting old files never delays the next commit).
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from ..errors import CheckpointWriteError
from ..workers import Task, Workers
from ..write.deadline import Deadline
from .agreement import Agreement
from .protocol import CommitUnit


class OrderedCommits:
    """Commits units in the order they were issued, the same on every rank."""

    def __init__(self, agreement: Agreement, deadline: Deadline, slack_s: float, name: str = "fastckpt-commit"):
        """slack_s: how much longer than the deadline a wait for other ranks may take."""
        self._agree, self._deadline, self._slack = agreement, deadline, slack_s
        self._name = name
        self._lock = threading.Lock()
        self._last: Optional[threading.Event] = None  # set once the newest issued unit landed
        self._issued = 0
        self._workers = Workers(name)  # each unit runs on one, taken at once (fastckpt.workers)
        self._tasks: list[Task] = []  # the units' tasks not yet joined (join())
        # (index of the first unit that may not exchange any more, why): see _run
        self._broken: Optional[tuple[int, str]] = None

    def issue(self, unit: CommitUnit, error: Optional[BaseException] = None,
              track: Optional[Callable[[Task], None]] = None) -> None:
        """Starts the unit's commit on a worker thread (a warm one, running one unit at a time: the
        caller does not wait for a thread to start). error: the unit failed before it began (it
        still takes its turn, so that every rank makes the same collectives). track(task): called
        before the unit starts (so that its landing always finds it tracked); the task joins as a
        thread does."""
        landed = threading.Event()
        with self._lock:
            before, self._last = self._last, landed
            index, self._issued = self._issued, self._issued + 1
            # handed over under the lock: join() from another thread never misses it
            task = self._workers.run(lambda: self._run(unit, error, before, landed, index),
                                     f"{self._name}-{unit.label}", before=track)
            self._tasks = [t for t in self._tasks if t.is_alive()] + [task]

    def join(self, retire: bool = True) -> None:
        """Until every unit issued so far has run to its end (afterwards() included); then, with
        retire, the idle commit threads end: what an owner's close() calls, so that no commit
        thread outlives it (a wait between saves passes retire=False: they stay warm)."""
        with self._lock:
            tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.join()
        if retire:
            self._workers.retire()

    def _out_of_step(self, index: int) -> Optional[str]:
        broken = self._broken
        return broken[1] if broken is not None and index >= broken[0] else None

    def _run(self, unit: CommitUnit, error, before: Optional[threading.Event], landed: threading.Event,
             index: int) -> None:
        try:
            part = None
            if error is None:
                try:
                    part = unit.finish()
                except BaseException as e:  # noqa: BLE001 - surfaced through landed(), never swallowed
                    error = e
            if before is not None and self._out_of_step(index) is None:
                t = time.monotonic()
                try:  # bounded: the unit before has its own deadlines
                    self._deadline.wait(f"the commit before {unit.label}", before.wait, slack=self._slack)
                except BaseException as e:  # noqa: BLE001 - WriteStalled, or the progress counter failed
                    error = error or e
                    if self._agree.world_size > 1 and not before.is_set():
                        # the unit before may still be in a collective on the same group: joining in
                        # now could pair this unit's exchange with its exchange on another rank. Units
                        # issued before this one still exchange, in step with the other ranks.
                        with self._lock:
                            if self._broken is None:
                                self._broken = (index, f"the commit of a checkpoint before {unit.label} stalled, "
                                                "so the ranks no longer commit in step; this rank commits "
                                                "nothing more until reopened")
                unit.timed("order_wait", time.monotonic() - t)
            t = time.monotonic()
            out_of_step = self._out_of_step(index)
            if out_of_step is not None:
                info, error = None, error or CheckpointWriteError(f"{unit.label} was not committed: {out_of_step}")
            else:
                if error is None:
                    try:
                        part = unit.in_order(part)
                    except BaseException as e:  # noqa: BLE001
                        error = e
                info, error = self._agree_and_record(unit, part, error)
            unit.timed("commit", time.monotonic() - t)
            unit.landed(info, error)
        finally:
            landed.set()
        unit.afterwards()

    def _agree_and_record(self, unit: CommitUnit, part, error):
        try:
            everyone = self._agree.gather((error is None, part if error is None else None), background=True)
            if not all(ok for ok, _ in everyone):
                return None, error or CheckpointWriteError(
                    f"another rank failed to write its part of {unit.label}; the previous checkpoint stays the latest")
            info, failed = None, None
            try:
                info = unit.record([p for _, p in everyone], self._agree.rank)
            except BaseException as e:  # noqa: BLE001 - every rank must still hear of it
                failed = e
            if not self._agree.all_ok(failed is None, background=True):
                if failed is not None:
                    return None, failed
                return None, CheckpointWriteError(f"writing the commit record of {unit.label} failed on another "
                                                  "rank; the previous checkpoint stays the latest")
            return info, None
        except BaseException as e:  # noqa: BLE001 - a collective that failed (a rank died)
            return None, error or e
