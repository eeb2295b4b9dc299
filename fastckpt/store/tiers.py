"""The tier composition (settings `tiers`): tiers in front — each rank's folder of a memory tier
or a node-local disk (fastckpt.store.node_tier) — and one store behind them all, the last.

A save is written to and committed on the first tier at memory speed; once committed, its owner
persists it behind from that committed copy (fastckpt.commit.persist_unit: the owner's second
ordered commit), each part checked against its record before a byte leaves; the training state
is never read again for it. When the first tier has no room (checked at every save: `fits`) or a
preemption hurries the saves (`hurry`), every save goes to the last store alone from then on;
those begun in front still commit there (and are persisted behind as each kind says: the
Checkpointer's steps are not, a path's every save is).

This module is what every composition shares: where a save begins and which tier each of its
calls goes to (`tier_of`), the room check, handing a committed copy over to be persisted and
sparing what is being copied from retention (`held`), retention on every tier, closing. What lies
behind, and how a checkpoint is read back, is one of two kinds:
  fastckpt.store.tiered_store  the Checkpointer's steps: the root's layout on a disk or in a bucket
                               (any node-local tiers between), a copy that falls behind gives way to
                               a newer one, reads routed from the fastest tier, replicas;
  fastckpt.store.named_tiers   the caller's paths (Lightning's `.ckpt`, DeepSpeed's tag files), on a
                               disk or at an s3:// URL: every save of a path reaches it, in order.
"""
from __future__ import annotations

import abc
import os
import threading
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..commit.persist_unit import PersistCommit
from ..commit_info import CommitInfo
from .protocol import Store


@dataclass
class CopyPlan:
    """How one checkpoint committed in front is persisted behind: the tiers it is copied to;
    ready() (under the composition's lock, at its turn): whether this rank may copy it now;
    refused() when some rank may not: False (given way to a newer one: Superseded), or it raises;
    the folders spared from retention from the hand-over on, and from the copy's start on."""

    tiers: list
    ready: Callable[[], bool]
    refused: Callable[[], bool]
    spared: frozenset = field(default_factory=frozenset)
    spared_going: frozenset = field(default_factory=frozenset)


def parent_of(ckpt_id: str) -> str:
    """The folder (or a bucket's prefix) a checkpoint folder or part lies in."""
    return ckpt_id.rsplit("/", 1)[0] if "://" in ckpt_id else os.path.dirname(os.path.abspath(ckpt_id))


class Tiers(Store):
    """tiers: the tiers in front (NodeTiers: each this rank's folder) then the last store; keeps:
    each tier's retention count (`tier_keep`, the last's is `keep`). Subclasses say what a copy
    behind is (`plan_copy`) and how checkpoints are read."""

    every_rank_retains = True  # each rank's memory-tier folder is its own to prune
    alone = "the last tier"  # where saves go once the first tier is out of room (said in the warning)
    where_short = " on some rank"  # where it was out of room (said in the warning)

    def __init__(self, tiers: list, keeps: tuple[int, ...], rank: int, direct_io: bool = True):
        self.tiers = tiers
        self.keeps, self.rank, self.direct_io = keeps, rank, direct_io
        self.first = 0  # the tier saves commit to (the last, once shrunk or hurried)
        self.neighbours = 1  # ranks sharing the first tier's memory, this one included (as join() finds them)
        self._lock = threading.Lock()
        self._held: set[str] = set()  # folders retention spares: copies handed over or in progress

    @property
    def last(self):
        return self.tiers[-1]

    @property
    def writes_to(self):
        return self.tiers[self.first]

    @property
    def on_last(self) -> bool:
        return self.first == len(self.tiers) - 1

    # -- 0. opening ------------------------------------------------------------
    def prepare(self) -> None:
        for tier in self.tiers:
            tier.prepare()
        for tier in self.tiers[:-1]:  # every rank's own folder (rank 0 alone runs remove_uncommitted)
            tier.remove_uncommitted()

    def remove_uncommitted(self) -> None:
        self.last.remove_uncommitted()

    def next_counter(self) -> int:
        return max(tier.next_counter() for tier in self.tiers)

    @property
    def bounded(self) -> bool:
        """While saves go to a memory tier, its room is checked at every save (an optimizer's state
        made at its first step, or other users of the memory, can make the first save's check stale);
        so is the last store's, when it says so (a bucket spooling on a memory filesystem)."""
        return not self.on_last or self.last.bounded

    def kept_per_part(self) -> int:
        """Parts the first tier keeps per checkpoint of this rank (its own, and replicas)."""
        return 1

    def waiting(self) -> int:
        """Copies handed over and not yet landed that the first tier holds besides the keep, the saves
        in flight and one more (0: a copy waiting gives way to a newer one)."""
        return 0

    def fits(self, nbytes: int, concurrency: int) -> bool:
        """Whether the first tier has room for its keep, the saves in flight, the copies waiting and
        the one being copied, each with its replicas, for every rank sharing its memory that join()
        found (nbytes: this rank's part, taken as every rank's). Saves going to the last store: its
        own room."""
        if self.on_last:
            return self.last.fits(nbytes, concurrency)
        tier = self.writes_to
        need = (self.keeps[self.first] + concurrency + self.waiting() + 1) * nbytes * self.kept_per_part()
        return tier.has_room(need * self.neighbours, self.neighbours)

    def shrink(self, nbytes: int, concurrency: int) -> str:
        """Saves go to the last store alone; the warning that says so. Already there: the last
        store shrinks (a bucket spools its parts on disk)."""
        if self.on_last:
            return self.last.shrink(nbytes, concurrency)
        tier = self.writes_to
        self.first = len(self.tiers) - 1
        return (f"the memory tier {tier.place} has no room for {self.keeps[0]} + {concurrency} + 1 checkpoints of "
                f"{nbytes / 2**20:.0f} MiB{self.where_short}; checkpoints go to {self.alone} alone")

    def hurry(self) -> None:
        """From now on saves go straight to the last store (durable there soonest: a preemption's);
        those begun in front still commit there."""
        self.first = len(self.tiers) - 1

    # -- 1-4. writing and committing: the tier each call belongs to --------------
    @property
    def sink_kind(self) -> str:
        """The sink of the tier saves go to now (a memory tier's is "memory": no staging)."""
        return self.writes_to.sink_kind

    def tier_of(self, ckpt_id: Optional[str]):
        """The tier a checkpoint was begun on: the tier in front whose folder holds it, else the
        last store (a bucket's parts are spooled elsewhere; a path's are beside it). Its calls go
        there, whichever tier later saves go to."""
        if ckpt_id is None:
            return self.writes_to
        parent = parent_of(ckpt_id)
        return next((t for t in self.tiers[:-1] if t.root == parent), self.last)

    def begin(self, step, counter, rank, fmt, target=None, plan=None, meta=None):
        return self.writes_to.begin(step, counter, rank, fmt, target, plan, meta)

    def sink(self, part: str, direct_io: bool):
        return self.tier_of(os.path.dirname(part)).sink(part, direct_io)  # parts are local files

    def finish_write(self, write, part: str):
        """The tier the part was begun on finishes it (an object store: uploads it)."""
        return self.tier_of(os.path.dirname(part)).finish_write(write, part)

    def commit_file(self, ckpt_id, part, result):
        return self.tier_of(ckpt_id).commit_file(ckpt_id, part, result)

    def commit_rank(self, ckpt_id, info):
        self.tier_of(ckpt_id).commit_rank(ckpt_id, info)

    def commit(self, info):
        self.tier_of(info.path).commit(info)

    def abort(self, ckpt_id, part, rank, stuck=False):
        self.tier_of(ckpt_id).abort(ckpt_id, part, rank, stuck)

    # -- persisting behind ---------------------------------------------------------
    part_rank = property(lambda self: self.rank)  # the rank a part of this store's checkpoints is

    @abc.abstractmethod
    def plan_copy(self, info: CommitInfo) -> Optional[CopyPlan]:
        """How a checkpoint committed in front is persisted behind (None: nothing to copy)."""

    def persist_unit(self, info: CommitInfo, landed, retain, agree_all):
        """The unit that persists a checkpoint just committed in front to what lies behind it
        (None: it went to the last store, or there is nothing behind). landed(unit, infos, error),
        retain() (calls retain_behind): the owner's; agree_all(ok) -> bool: the persist chain's
        all-ranks AND. At its turn it goes only if every rank is ready (plan.ready); what it
        spares from retention is spared until it lands."""
        if self.tier_of(info.path) is self.last:
            return None
        plan = self.plan_copy(info)
        if plan is None:
            return None
        with self._lock:
            self._held |= plan.spared

        def go(unit) -> bool:
            with self._lock:
                ready = plan.ready()
                if ready:
                    self._held |= plan.spared_going
            if agree_all(ready):
                return True
            with self._lock:
                self._held -= plan.spared_going
            return plan.refused()

        def done(unit, infos, error):
            with self._lock:
                self._held -= plan.spared | plan.spared_going
            landed(unit, infos, error)
        return PersistCommit(info, self.part_rank, plan.tiers,
                             lambda tier, src, folder, entry: tier.put_copy(src, folder, entry, self.direct_io),
                             go, done, retain)

    # -- 7-8. removing, closing --------------------------------------------------
    def _retain(self, tiers: list, in_flight: set) -> None:
        with self._lock:  # held throughout: no copy starts (go) between what it spares and its removals
            spared = set(in_flight) | self._held
            for tier in tiers:
                i = self.tiers.index(tier)
                if tier is not self.last or self.rank == 0:  # the last store is shared: rank 0 prunes it
                    tier.retain(self.keeps[i], spared)

    def retain(self, keep: int, in_flight: set) -> None:
        """Every rank, after a commit: each tier's own keep (`tier_keep`; `keep` is the last's) on the
        first tier and the one saves go to now; never a folder in flight, being copied or waiting."""
        self._retain(list(dict.fromkeys([self.tiers[0], self.writes_to])), in_flight)

    def retain_behind(self, in_flight: set) -> None:
        """After a copy landed: each tier's keep on every tier (what the first held back while
        copying may go now)."""
        self._retain(self.tiers, in_flight)

    def close(self) -> None:
        for tier in self.tiers:
            tier.close()
