"""FastStager's slots: the place of one snapshot (its reused buffers and where the snapshot
stands), the future stage() returns for it, SaveSkipped, and SnapshotOwner (what a
FastStorageWriter asks of the stager it is given: which slot holds a tensor; that its save
copied a live snapshot).

A slot's state moves one way, FREE -> STAGING -> COPIED -> DELIVERED, and back to FREE when it
is released (or refused before its snapshot began):
  FREE       no snapshot; its buffers wait for the next one
  STAGING    stage() took it; copies of the caller's tensors may still run
  COPIED     no copy reads the caller's tensors any more (what the step gate waits for)
  DELIVERED  its future is resolved: the snapshot is DCP's save's, or the save failed
The slots themselves are drawn from write.concurrency's ConcurrencySlots, the bound a
Checkpointer's checkpoints are drawn from too: a Slot is one of its slots, TAKEN there while
its state here is not FREE. What moves the state is FastStager's (fastckpt.dcp.stager), through
`to()`, which refuses any other move; a Slot itself only answers whether its save is done with it.
"""
from __future__ import annotations

import concurrent.futures
import enum
import threading
from typing import Optional, Protocol

import torch

from ..errors import FastckptError
from ..write.snapshot_buffers import SnapshotBuffers
from ..write.watch import SnapshotWatch


class SaveSkipped(FastckptError):
    """policy='skip': every staging slot was taken on some rank, so no rank saved this time."""


class SlotState(enum.IntEnum):
    FREE = 0
    STAGING = 1
    COPIED = 2
    DELIVERED = 3


class Slot:
    """One snapshot's place: its buffers, its state, and what its snapshot needs to know."""

    def __init__(self, buffers: SnapshotBuffers, index: int):
        self.index = index
        self.buffers = buffers
        self.state = SlotState.FREE
        self.seq = -1
        self.error: Optional[BaseException] = None
        self.staged_by: Optional[threading.Thread] = None  # the thread that called stage()
        self.taken_by: Optional[threading.Thread] = None  # the save thread that took the snapshot
        self.tensors = 0  # tensor leaves of this snapshot
        self.taken_here = False  # the thread that staged it took the snapshot (a plain dcp.save)
        self.alive = 0  # staged tensor objects of this snapshot (seq) still referenced
        self.refs: list = []  # weak references to them, whose callbacks count them down
        self.live: list[int] = []  # strategy 'd' (or copied by the writer): the caller's storages the snapshot is
        self.writer_copies = False  # 'c' with its writer: the live tensors are copied by the writer's save
        self.copied_by_writer = False  # ... and that copy is done: the gate lets the optimizer step go
        self.watch: Optional[SnapshotWatch] = None  # the versions of the tensors copied late ('d': never copied)
        self.unwinding = False  # the stager's thread has not yet returned from this snapshot's work

    def to(self, state: SlotState) -> None:
        """Moves the slot on: to FREE from any state, from FREE only to STAGING; else forward, or
        where it is already (a copy made at once and none left for later is COPIED twice)."""
        legal = (state is SlotState.FREE or (state is SlotState.STAGING and self.state is SlotState.FREE)
                 or (self.state is not SlotState.FREE and state >= self.state and state is not SlotState.STAGING))
        if not legal:
            raise RuntimeError(f"fastckpt: a staging slot cannot go from {self.state.name} to {state.name}")
        self.state = state

    @property
    def busy(self) -> bool:
        return self.state is not SlotState.FREE

    @property
    def copied(self) -> bool:
        return self.state >= SlotState.COPIED

    @property
    def delivered(self) -> bool:
        return self.state is SlotState.DELIVERED

    def holds(self, address: int) -> bool:
        """Whether the snapshot staged here now lies (in part) in the storage at `address`."""
        return self.busy and (self.buffers.holds(address) or address in self.live)

    def finished(self) -> bool:
        """The save that staged here no longer needs the snapshot."""
        if not self.busy:
            return True
        if not self.delivered or self.unwinding:  # unwinding: that thread's frames still hold it
            return False
        ended = self.taken_by is not None and not self.taken_by.is_alive()
        if self.tensors == 0:  # nothing to count: the save thread's end, or taken by the caller itself
            return ended or self.taken_here
        return self.alive == 0 or ended

    def torn(self) -> str:
        """'' when no tensor of the snapshot was written in place before it was copied (with 'd':
        before it was written); else the first one's path. Decided once."""
        return self.watch.check() if self.watch is not None else ""


class StagedFuture(concurrent.futures.Future):
    """The future stage() returns. A save thread taking its result waits for the earlier saves
    (saves stay in order) and takes the snapshot over: the future lets go of it then, so the
    slot is free the moment that save is done with it (not once DCP drops the future too)."""

    def __init__(self, stager, slot: Slot, seq: int):
        super().__init__()
        self._stager, self._slot, self._seq = stager, slot, seq

    def result(self, timeout=None):
        handed_over = self._stager._taken(self._slot, self._seq)
        box = super().result(timeout)  # [snapshot] until a save thread took it
        if handed_over:
            return box.pop()
        return box[0] if box else None  # DCP's own callback, after the save thread took it


class SnapshotOwner(Protocol):
    """What a FastStorageWriter asks of a stager given it (FastStager(writer=...), writer.meet)."""

    def snapshot_of(self, t: torch.Tensor) -> Optional[Slot]:
        """The slot whose snapshot, staged now, holds t's memory; None when none of its own does."""

    def writer_copied(self, slot: Slot, seq: int) -> None:
        """The writer's save copied the live tensors of snapshot seq, staged in slot."""
