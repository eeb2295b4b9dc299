"""The tiered store: a memory tier (or several) in front of the root (settings `tiers`).

  tiers=("/dev/shm/run7", "/ssd/run7"): a save is written to and committed on the first tier
  (each rank's folder there: fastckpt.store.node_tier) at memory speed; once committed, its
  owner persists it to each later tier from that committed copy (fastckpt.commit.persist_unit:
  the owner's second ordered commit), never from the training state. The last tier is the root
  (store 'root''s layout, with its `latest`).

Reading: `committed()` is every step this rank can get from any tier, newest first; `load()`
reads this rank's part from the fastest tier that holds it and verifies, and a part that fails
its CRC there is named in a warning (tier and file) and the next tier is tried — once each,
so falling back never loops. `reads` says which tier each part came from.

Retention: each tier keeps its own count (`tier_keep`), never removing a step before a newer
one is committed there, and the first tier never removes a step still being copied behind it.
Memory: the first tier needs (its keep + concurrency) checkpoints' room; when it has not that
room on some rank at the first save, every rank writes to the last tier alone (`shrink`).
"""
from __future__ import annotations

import logging
import os
import threading
import warnings
from dataclasses import dataclass
from typing import Optional

from ..commit.persist_unit import PersistCommit
from ..commit_info import CommitInfo
from ..errors import CorruptCheckpointError
from ..format import load_file
from ..verify import verify_file
from .node_tier import NodeTier
from .protocol import Store
from .root_store import RootStore
from .tier_copy import copy_part

log = logging.getLogger("fastckpt")


@dataclass(frozen=True)
class Read:
    """One part read back: its step, rank, and the tier (place) it came from."""

    step: int
    rank: int
    tier: str
    path: str


class TieredStore(Store):
    kind = "root"
    survey_kind = "root"
    every_rank_retains = True  # each rank's memory-tier folder is its own to prune

    def __init__(self, places: tuple[str, ...], keeps: tuple[int, ...], rank: int, direct_io: bool = True):
        self.tiers: list[RootStore] = [NodeTier(p, rank) for p in places[:-1]] + [RootStore(places[-1])]
        self.places = tuple(os.path.abspath(p) for p in places)
        self.keeps, self.rank, self.direct_io = keeps, rank, direct_io
        self.root = self.tiers[-1].root
        self.first = 0  # the tier saves commit to (the last, once shrunk)
        self.reads: list[Read] = []
        self._lock = threading.Lock()
        self._copying: set[str] = set()  # first-tier folders being persisted behind it
        self._holders: dict[int, list[tuple[int, CommitInfo]]] = {}

    @classmethod
    def open(cls, config, rank: int, world_size: int) -> "TieredStore":
        return cls(config.tiers, config.keep_on_tiers(), rank, config.direct_io)

    @property
    def writes_to(self) -> RootStore:
        return self.tiers[self.first]

    def behind(self) -> list[RootStore]:
        """The tiers a committed save is persisted to, after the one it committed on."""
        return self.tiers[self.first + 1:]

    # -- 0. opening ------------------------------------------------------
    def prepare(self) -> None:
        for tier in self.tiers:
            tier.prepare()
        for tier in self.tiers[:-1]:  # every rank's own folder (rank 0 alone runs remove_uncommitted)
            tier.remove_uncommitted()

    def remove_uncommitted(self) -> None:
        self.tiers[-1].remove_uncommitted()

    def next_counter(self) -> int:
        return max(tier.next_counter() for tier in self.tiers)

    def fits(self, nbytes: int, concurrency: int) -> bool:
        """Whether the first tier has room for (its keep + concurrency) checkpoints of nbytes."""
        if self.first == len(self.tiers) - 1:
            return True
        tier = self.tiers[self.first]
        need = (self.keeps[self.first] + concurrency) * nbytes
        return tier.free_bytes() + tier.used_bytes() >= need

    def shrink(self, nbytes: int, concurrency: int) -> str:
        """Saves go to the last tier alone; the warning that says so."""
        tier = self.tiers[self.first]
        self.first = len(self.tiers) - 1
        return (f"the memory tier {tier.place} has no room for {self.keeps[0]} + {concurrency} checkpoints of "
                f"{nbytes / 2**20:.0f} MiB on some rank; checkpoints go to {self.root} alone")

    # -- 1-4. writing and committing: the first tier ---------------------------
    def begin(self, step, counter, rank, fmt, target=None, plan=None, meta=None):
        return self.writes_to.begin(step, counter, rank, fmt, target, plan, meta)

    def sink(self, part: str, direct_io: bool):
        last = self.first == len(self.tiers) - 1
        return self.writes_to.sink(part, direct_io and last)  # memory: O_DIRECT means nothing there

    def commit_file(self, ckpt_id, part, result):
        return self.writes_to.commit_file(ckpt_id, part, result)

    def commit_rank(self, ckpt_id, info):
        self.writes_to.commit_rank(ckpt_id, info)

    def commit(self, info):
        self.writes_to.commit(info)

    def abort(self, ckpt_id, part, rank, stuck=False):
        self.writes_to.abort(ckpt_id, part, rank, stuck)

    def persist_unit(self, info: CommitInfo, landed, retain) -> Optional[PersistCommit]:
        """The unit that persists a checkpoint just committed on the first tier to the tiers
        behind it (None: there are none); its folder is kept from retention until it lands.
        landed(unit, infos, error), retain(): the owner's (retain: calls retain_behind)."""
        behind = self.behind()
        if not behind:
            return None
        with self._lock:
            self._copying.add(info.path)

        def done(unit, infos, error):
            with self._lock:
                self._copying.discard(info.path)
            landed(unit, infos, error)
        return PersistCommit(info, self.rank, behind, lambda src, dst, entry: copy_part(src, dst, entry, self.direct_io),
                             done, retain)

    # -- 5-6. listing and reading: the fastest tier first ------------------------
    def committed(self, problems: Optional[list] = None) -> list[CommitInfo]:
        holders: dict[int, list[tuple[int, CommitInfo]]] = {}
        for i, tier in enumerate(self.tiers):
            for info in tier.committed(problems):
                holders.setdefault(info.counter, []).append((i, info))
        with self._lock:
            self._holders = holders
        return [copies[0][1] for _, copies in sorted(holders.items(), reverse=True)]

    def holding(self) -> dict[int, list[str]]:
        """Each committed step's tiers (places), fastest first."""
        out: dict[int, list[str]] = {}
        self.committed()
        for _, copies in sorted(self._holders.items(), reverse=True):
            out.setdefault(copies[0][1].step, [self.places[i] for i, _ in copies])
        return out

    def _copies(self, info: CommitInfo) -> list[tuple[int, CommitInfo]]:
        with self._lock:
            copies = self._holders.get(info.counter)
        if copies is None:
            self.committed()
            with self._lock:
                copies = self._holders.get(info.counter, [])
        return copies or [(0, info)]

    def verify(self, info: CommitInfo) -> None:
        last = None
        for i, copy in self._copies(info):
            try:
                for f in copy.files if i == len(self.tiers) - 1 else (copy.entry_for(self.rank),):
                    verify_file(os.path.join(copy.path, f.name), f)
                return
            except (CorruptCheckpointError, OSError) as e:
                last = e
        raise last

    def load(self, info: CommitInfo, rank: int, map_location=None, verify: bool = True, weights_only: bool = True,
             mmap=None):
        """This rank's part, from the fastest tier whose copy verifies; each copy that does not
        is named in a warning and the next tier tried (each tier once)."""
        copies = self._copies(info)
        last = None
        for n, (i, copy) in enumerate(copies):
            path = copy.file_for(rank)
            try:
                state = load_file(path, map_location, verify, weights_only,
                                  expect_crc=copy.entry_for(rank).crc32 if verify else None, mmap=mmap)
            except (CorruptCheckpointError, OSError) as e:
                last = e
                then = (f"reading it from the tier {self.places[copies[n + 1][0]]}" if n + 1 < len(copies)
                        else "no other tier holds it")
                say = (f"fastckpt: rank {rank}'s part of step {info.step} in the tier {self.places[i]} "
                       f"({path}) does not verify: {e}; {then}")
                log.warning(say)
                warnings.warn(say, stacklevel=3)
                continue
            with self._lock:
                self.reads.append(Read(info.step, rank, self.places[i], path))
            return state
        raise last

    # -- 7-8. removing, closing ------------------------------------------------
    def retain(self, keep: int, in_flight: set) -> None:
        """Every rank, after a commit on the first tier: its keep there (`keep` is the last tier's)."""
        with self._lock:
            busy = set(in_flight) | self._copying
        tier = self.writes_to
        if self.rank == 0 or tier is not self.tiers[-1]:
            tier.retain(self.keeps[self.first], busy)

    def retain_behind(self, in_flight: set) -> None:
        """After a persist landed: each tier's keep, on the tiers behind (rank 0 alone on the shared
        last tier) and on the first (what it held back while copying may go now)."""
        for tier in self.behind():
            if tier is not self.tiers[-1] or self.rank == 0:
                tier.retain(self.keeps[self.tiers.index(tier)], set())
        self.retain(self.keeps[-1], in_flight)

    def close(self) -> None:
        for tier in self.tiers:
            tier.close()
