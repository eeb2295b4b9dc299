"""FastStager's slots: one snapshot in flight (what it holds, who took it, whether its save is
done with it), the future stage() returns for it, SaveSkipped, and SnapshotOwner (what a
FastStorageWriter asks of the stager it is given: which slot holds a tensor; that its save
copied a snapshot's live tensors).

The slots themselves are drawn from write.concurrency's ConcurrencySlots, the bound a
Checkpointer's checkpoints are drawn from too: a Slot is one of its slots, TAKEN there while it
is busy here. A slot holds no memory of its own: a snapshot is the caller's tensors handed on
live (copied by the writer's save) and copies made when stage() ran, which go with it.
"""
from __future__ import annotations

import concurrent.futures
import threading
from typing import Any, Optional, Protocol

import torch

from ..errors import FastckptError
from ..write.watch import SnapshotWatch


class SaveSkipped(FastckptError):
    """policy='skip': every staging slot was taken on some rank, so no rank saved this time."""


class Slot:
    """One snapshot in flight: what it holds and what its save needs to know."""

    def __init__(self, index: int, strategy: str):
        self.index = index
        self.strategy = strategy  # the stager's: how the writer copies the live tensors
        self.seq = -1
        self._clear()

    def _clear(self) -> None:
        self.busy = False
        self.staging = False  # stage() has not yet returned it
        self.staged_by: Optional[threading.Thread] = None  # the thread that called stage()
        self.taken_by: Optional[threading.Thread] = None  # the save thread that took the snapshot
        self.tensors = 0  # tensor leaves of this snapshot
        self.taken_here = False  # the thread that staged it took the snapshot (a plain dcp.save)
        self.alive = 0  # its tensor objects still referenced
        self.refs: list = []  # weak references to them, whose callbacks count them down
        self.copies: set[int] = set()  # storages of the copies made at stage()
        self.live: set[int] = set()  # storages of the caller's tensors, handed on to the writer
        self.copied_by_writer = False  # the writer's save has copied those: the gate lets the step go
        self.watch: Optional[SnapshotWatch] = None  # the versions of the live tensors at stage()
        self.after: list = []  # CUDA events recorded at stage() on the streams the live tensors were written on

    def begin(self, seq: int, by: threading.Thread) -> None:
        """A new snapshot in this slot (the stager's lock held)."""
        self._clear()
        self.busy, self.staging, self.seq, self.staged_by = True, True, seq, by

    def end(self) -> None:
        """Its save is done with it: the slot holds nothing (the stager's lock held)."""
        self._clear()

    def order_after_stage(self) -> None:
        """On the thread that copies the live tensors (DCP's save thread): its streams wait for
        what the training thread had queued when it staged them, whatever stream that was."""
        for device, event in self.after:
            torch.cuda.current_stream(device).wait_event(event)

    def holds(self, address: int) -> bool:
        """Whether the snapshot staged here, still in use, lies (in part) in the storage at
        `address` (0: an empty storage, nobody's)."""
        return (self.busy and address != 0 and (address in self.copies or address in self.live)
                and not self.finished())

    @property
    def waits_for_writer(self) -> bool:
        """Live tensors the writer has not yet copied: what the optimizer step waits for."""
        return self.busy and bool(self.live) and not self.copied_by_writer and not self.finished()

    def finished(self) -> bool:
        """The save that staged here no longer needs the snapshot."""
        if not self.busy:
            return True
        if self.staging:
            return False
        ended = self.taken_by is not None and not self.taken_by.is_alive()
        if self.tensors == 0:  # nothing to count: the save thread's end, or taken by the caller itself
            return ended or self.taken_here
        return self.alive == 0 or ended

    def torn(self) -> str:
        """'' when no live tensor of the snapshot was written in place before the writer copied
        it (with 'd': before it was written); else the first one's path. Decided once."""
        return self.watch.check() if self.watch is not None else ""


class StagedFuture(concurrent.futures.Future):
    """The future stage() returns, resolved at once. A save thread taking its result waits for
    the earlier saves (saves stay in order) and takes the snapshot over: the future lets go of it
    then, so the slot is free the moment that save is done with it (not once DCP drops the future
    too)."""

    def __init__(self, stager: Any, slot: Slot, seq: int, snapshot: Any):
        super().__init__()
        self._stager, self._slot, self._seq = stager, slot, seq
        self.set_result([snapshot])

    def result(self, timeout: Optional[float] = None) -> Any:
        handed_over = self._stager._taken(self._slot, self._seq)
        box = super().result(timeout)  # [snapshot] until a save thread took it
        if handed_over:
            return box.pop()
        return box[0] if box else None  # DCP's own callback, after the save thread took it


class SnapshotOwner(Protocol):
    """What a FastStorageWriter asks of a stager given it (FastStager(writer=...), writer.meet)."""

    def snapshot_of(self, t: torch.Tensor) -> Optional[Slot]:
        """The slot whose snapshot, staged now, holds t's memory; None when none of its own does."""

    def taken_by(self, thread: threading.Thread) -> Optional[Slot]:
        """The slot whose snapshot that save thread took; None when none of its own."""

    def writer_copied(self, slot: Slot, seq: int) -> None:
        """The writer's save copied the live tensors of snapshot seq, staged in slot."""
