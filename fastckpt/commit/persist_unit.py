"""PersistCommit: a checkpoint committed on the first tier, made durable on each later tier from
that committed copy, as a unit of the ordered commit (fastckpt.commit.protocol).

Copies run one at a time, in commit order (in in_order: after the unit before landed), so the
disk is never asked for two at once. At its turn a unit first asks, in one collective of its
chain, whether every rank still has its source and has no newer checkpoint waiting to be
copied (`go`); if not, it is Superseded — the newer one will be copied instead — and nothing
of it is written (saves faster than the disk: the disk gets the newest at each turn, and the
memory tier holds at most its keep, the saves in flight and the one being copied). Otherwise
each rank copies its own part (the files its record names for it: a Checkpointer's one, a set's
any number) from its first-tier folder (checked against the record before a
byte is written: fastckpt.store.tier_copy); once every rank's copy is durable, rank 0 writes the
tier's record (the same record: step, counter, every file's size and CRC) and moves its
`latest`. A unit that fails leaves nothing of itself on the later tiers; the first tier's copy
stays committed. The training state is never read again for it.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
from typing import Callable, Optional

from ..commit_info import CommitInfo
from .protocol import CommitUnit

log = logging.getLogger("fastckpt")


NICE = 19  # a copy behind the memory tier yields the CPU to training (Linux: a thread's own priority)


def background() -> None:
    """This thread (a copy's commit thread) runs at a lower priority than training's threads:
    on a machine whose cores training fills, the copy takes what is left rather than stalling
    a step (a copy that falls behind is superseded by a newer one, never queued)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
    except (AttributeError, OSError):
        pass


class Superseded(Exception):
    """A copy not made: a newer checkpoint is waiting to be copied (or its source is gone)."""


class PersistCommit(CommitUnit):
    """Args: the first tier's record (info: its folder is this rank's), this rank, the later
    tiers (stores with new_dir/commit_rank/commit/remove/retain), copy(tier, src, folder, entry):
    the durable copy of one part into the tier's folder (returns its entry there, or None: the
    same); go(unit): whether every rank copies it now (a collective of the
    chain; True marks its source busy until it lands); landed(unit, infos, error): its owner's
    bookkeeping; retain(): retention once it landed (on every tier). one_each: every rank has one
    file in the record (a Checkpointer's checkpoint); False: any number, none included (a file set's)."""

    def __init__(self, info: CommitInfo, rank: int, tiers: list, copy: Callable, go: Callable[["PersistCommit"], bool],
                 landed: Callable[["PersistCommit", Optional[list], Optional[BaseException]], None],
                 retain: Callable[[], None], one_each: bool = True):
        self.info, self.rank, self.tiers, self._copy, self._go = info, rank, tiers, copy, go
        self.one_each = one_each
        self._landed, self._retain = landed, retain
        self.label = f"the copy of step {info.step} to {', '.join(t.root for t in tiers)}"
        self.folders: list[str] = []  # where this rank copied its part, one per later tier

    def timed(self, phase: str, seconds: float) -> None:
        pass

    def finish(self):
        return None  # the copy waits for its turn: in_order

    def in_order(self, finished):
        if not self._go(self):
            raise Superseded(f"{self.label}: a newer checkpoint is copied instead")
        background()
        mine = ([self.info.entry_for(self.rank)] if self.one_each  # a Checkpointer's: one (none is damage)
                else [f for f in self.info.files if f.rank == self.rank])
        entries = []
        for tier in self.tiers:
            folder = tier.new_dir(self.info.step, self.info.counter)
            self.folders.append(folder)
            entries.append(tuple(self._copy(tier, os.path.join(self.info.path, f.name), folder, f) or f for f in mine))
        return tuple(entries)

    def record(self, parts: list, rank: int) -> list[CommitInfo]:
        """parts: each rank's entries, per tier (an object store's name its object and ETag)."""
        infos = []
        for i, (tier, folder) in enumerate(zip(self.tiers, self.folders)):
            info = dataclasses.replace(self.info, path=folder, files=tuple(f for p in parts for f in p[i]))
            tier.commit_rank(folder, info)
            if rank == 0:
                tier.commit(info)
            infos.append(info)
        return infos

    def landed(self, infos, error: Optional[BaseException]) -> None:
        if error is not None and self.folders:
            for tier in self.tiers:
                folder = os.path.join(tier.root, os.path.basename(self.info.path))
                try:
                    tier.abort(folder, None, self.rank)
                except OSError as e:  # the first tier's copy stays committed: nothing is lost
                    log.warning("fastckpt: could not remove the failed copy at %s: %s", folder, e)
        self._landed(self, infos, error)

    def afterwards(self) -> None:
        self._retain()
