"""In-place writes the gate does not see: the version counters of the tensors a snapshot copies late.

The gate orders the optimizer update after the copy. Anything else that writes a saved tensor in
place after save() returned — Lightning's ModelCheckpoint under manual optimization restoring the
weights it swapped in for the save, a callback swapping averaged weights back, user code — would
race the copy. Every in-place op on a tensor (or a view of it) bumps its version counter; writes
through `.data` do not, and are not seen.

`SnapshotWatch` keeps the versions of the tensors left to a snapshot at save(). `check()` compares
them once, under a lock, by whichever comes first of the gate (the copies are done and the
optimizer has not written yet) and the commit thread (before it commits): a change means the
snapshot may hold values from after save(), and the checkpoint is dropped (TornSnapshotError)
instead of committed.

Deferring the copy is earned (`Trust`): until a run has shown that between a save and the next
optimizer step nothing but the optimizer writes the saved tensors, each snapshot is copied before
save() returns and watched only to learn; a watch that sees a change withdraws the trust for the
rest of the run (until reset()).
"""
from __future__ import annotations

import logging
import threading
from typing import Optional

import torch

log = logging.getLogger("fastckpt")


class SnapshotWatch:
    """The versions of (path, tensor) pairs at save(); deferred: the copy runs after save() returns."""

    def __init__(self, tensors: list[tuple[str, torch.Tensor]], deferred: bool):
        self.deferred = deferred
        self._seen = [(path, t, t._version) for path, t in tensors]
        self._lock = threading.Lock()
        self._verdict: Optional[str] = None

    def check(self) -> str:
        """'' when no watched tensor was written in place since save(); else the first one's path.
        Decided once: later calls return the same answer (and the tensors are let go)."""
        with self._lock:
            if self._verdict is None:
                self._verdict = next((path or "<root>" for path, t, v in self._seen if t._version != v), "")
                self._seen = []
            return self._verdict


class Trust:
    """Whether snapshots may be copied after save() returns: earned by a watched save whose tensors
    nothing but the optimizer wrote before the next optimizer step, lost for the run by any watch
    that saw a write."""

    def __init__(self) -> None:
        self.deferred = False
        self._watches: list[SnapshotWatch] = []
        self._broken = False

    def watch(self, tensors: list[tuple[str, torch.Tensor]]) -> SnapshotWatch:
        w = SnapshotWatch(tensors, self.deferred)
        self._watches.append(w)
        return w

    def settle(self) -> None:
        """At an optimizer step, after its gate: what each watch since the last step saw."""
        watches, self._watches = self._watches, []
        if not watches:
            return
        changed = [c for c in (w.check() for w in watches) if c]
        if changed and not self._broken:
            log.warning("fastckpt: %s was written in place between a save and the next optimizer step "
                        "(not by the optimizer); snapshots are copied before save() returns from now on",
                        changed[0])
            self._broken = True
        self.deferred = not self._broken

    def reset(self) -> None:
        """A new run: trust is earned again."""
        self.deferred = self._broken = False
        self._watches = []
