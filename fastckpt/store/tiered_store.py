"""The tiered store: a memory tier (or several) in front of the root (settings `tiers`).

  tiers=("/dev/shm/run7", "/ssd/run7"): a save is written to and committed on the first tier
  (each rank's folder there: fastckpt.store.node_tier) at memory speed; once committed, its
  owner persists it to each later tier from that committed copy (fastckpt.commit.persist_unit:
  the owner's second ordered commit), never from the training state. The last tier is the root
  (store 'root''s layout, with its `latest`), or a bucket's prefix (tiers=(..., "s3://bucket/run7"):
  store 's3''s layout; each part uploaded from its committed copy, checked against its record
  first, then the record PUT once: training never waits for the object store).

Replicas (`replicas=1`): once every rank's part is durable, each rank sends its part to its
partner (fastckpt.store.partners: on another node when there is one) over the job's process
group, on the commit thread, and keeps its wards' parts beside its own in its memory-tier
folder, each CRC-checked on arrival (one that fails is dropped, with a warning: the checkpoint
commits without it); the record is written after (fastckpt.store.replicas).

Reading: every rank says what it holds (`offers`: its own memory-tier parts, the replicas it
keeps, the last tier); a step is taken only when every rank can get its part (`route`), each
from the fastest: its own memory tier, then its partner's replica (sent to it over the process
group, and kept in its memory tier again), then the last tier. A copy that fails its CRC is
named in a warning (tier and file) and the next is tried — each once, so falling back never
loops. `reads` says where each part came from.

Retention: each tier keeps its own count (`tier_keep`), never removing a step before a newer
one is committed there, and the first tier never removes the step being copied behind it.
Memory: the first tier holds at most its keep, the saves in flight and the one being copied
(fastckpt.commit.persist_unit: a copy waiting its turn gives way to a newer one), each with its
wards' replicas: (keep + concurrency + 1) x (1 + wards) parts; when it has not that room on some
rank at a save (checked at every save: `bounded`), every rank writes to the last tier alone from
that save on (`shrink`).
"""
from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from typing import Optional

from ..commit.record import present as record_present
from ..commit_info import CommitInfo
from ..errors import CorruptCheckpointError
from ..verify import verify_file
from .node_tier import NodeTier, load_lent
from .partners import node_name, partners, wards
from .replicas import Replicas
from .root_store import RootStore
from .s3.place import is_s3
from .s3.s3_store import S3Store
from .tiers import CopyPlan, Tiers

log = logging.getLogger("fastckpt")


class _Alone:
    rank = 0


@dataclass(frozen=True)
class Read:
    """One part read back: its step, rank, and the tier (place) it came from."""

    step: int
    rank: int
    tier: str
    path: str


class TieredStore(Tiers):
    """Tiers in front of the root's layout on a disk or in a bucket (see the module docstring)."""

    kind = "root"
    survey_kind = "root"

    def __init__(self, places: tuple[str, ...], keeps: tuple[int, ...], rank: int, direct_io: bool = True,
                 replicas: int = 0, endpoint: Optional[str] = None, part_mb: int = 64, timeout_s: float = 120.0):
        last = S3Store(places[-1], endpoint, part_mb, timeout_s) if is_s3(places[-1]) else RootStore(places[-1])
        super().__init__([NodeTier(p, rank) for p in places[:-1]] + [last], keeps, rank, direct_io)
        self.places = tuple(p.rstrip("/") if is_s3(p) else os.path.abspath(p) for p in places)
        self.root = last.root
        self.alone = last.root
        self.reads: list[Read] = []
        self._newest_handed = 0  # the counter of the newest checkpoint handed over to be persisted
        self._holders: dict[int, list[tuple[int, CommitInfo]]] = {}
        self.replicas = replicas
        self.partner_of: list = []  # rank -> the rank keeping its replica (join)
        self._replicas: Optional[Replicas] = None

    @classmethod
    def open(cls, config, rank: int, world_size: int) -> "TieredStore":
        return cls(config.tiers, config.keep_on_tiers(), rank, config.direct_io, config.replicas, config.endpoint,
                   config.chunk_mb, config.stall_timeout_s)

    def join(self, agreement) -> None:
        """Each rank's node gathered once (how many ranks share this node's memory); with
        replicas, who keeps whose (fastckpt.store.partners)."""
        if agreement.world_size < 2:
            return
        nodes = agreement.gather(node_name())
        self.neighbours = nodes.count(nodes[self.rank])
        if self.replicas:
            self.partner_of = partners(nodes)
            self._replicas = Replicas(self.tiers[0], agreement, self.partner_of, wards(self.partner_of, self.rank))

    def behind(self) -> list:
        """The tiers a committed save is persisted to, after the one it committed on."""
        return self.tiers[self.first + 1:]

    def kept_per_part(self) -> int:
        return 1 + (len(self._replicas.wards) if self._replicas is not None else 0)  # its part and its wards'

    def shrink(self, nbytes: int, concurrency: int) -> str:
        said = super().shrink(nbytes, concurrency)
        self._replicas = None
        return said

    def commit_rank(self, ckpt_id, info):
        """Every rank, every part durable: the replicas exchanged (checked on arrival), then the record."""
        if self._replicas is not None and self.tier_of(ckpt_id) is self.tiers[0]:
            self._replicas.exchange(ckpt_id, info)
        super().commit_rank(ckpt_id, info)

    def plan_copy(self, info: CommitInfo) -> Optional[CopyPlan]:
        """A copy to each tier behind; at its turn it goes only if every rank still holds its source
        and has not been handed a newer checkpoint to persist (else it gives way: Superseded). Its
        source, and the folders it is copied into (uncommitted until it lands: a save straight to
        the last tier meanwhile, after shrink() or hurry(), must not retain them away as dead), are
        spared from retention from its start until it lands."""
        behind = self.behind()
        if not behind:
            return None
        with self._lock:
            self._newest_handed = max(self._newest_handed, info.counter)
        return CopyPlan(behind, ready=lambda: self._newest_handed == info.counter and bool(record_present(info.path)),
                        refused=lambda: False,
                        spared_going=frozenset({info.path} | {os.path.join(t.root, os.path.basename(info.path)) for t in behind}))

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
        """Each committed step's tiers (places) on this rank, fastest first."""
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
        return copies

    def verify(self, info: CommitInfo) -> None:
        last = None
        for i, copy in self._copies(info) or [(len(self.tiers) - 1, info)]:
            try:
                if i == len(self.tiers) - 1:
                    self.tiers[i].verify(copy)
                else:
                    verify_file(copy.file_for(self.rank), copy.entry_for(self.rank))
                return
            except (CorruptCheckpointError, OSError) as e:
                last = e
        raise last

    def offers(self, problems: Optional[list] = None) -> dict:
        """counter -> (its record, the tiers holding this rank's part, the wards whose replicas
        this rank keeps of it)."""
        self.committed(problems)
        kept = self._replicas.kept() if self._replicas is not None else {}
        with self._lock:
            holders = dict(self._holders)
        out = {c: (copies[0][1], tuple(i for i, _ in copies), ()) for c, copies in holders.items()}
        for c, (info, ward_ranks) in kept.items():
            record, tiers, _ = out.get(c, (info, (), ()))
            out[c] = (record, tiers, ward_ranks)
        return out

    def route(self, counter: int, views: list, me: int):
        """Where each rank can get its part: (the tiers holding it, the partner keeping its replica
        or None); None when some rank can get it nowhere. The same on every rank."""
        routes = []
        for r, view in enumerate(views):
            tiers = view[counter][1] if counter in view else ()
            partner = self.partner_of[r] if self.partner_of else None
            if partner is None or r not in views[partner].get(counter, (None, (), ()))[2]:
                partner = None
            if not tiers and partner is None:
                return None
            routes.append((tiers, partner))
        info = next(view[counter][0] for view in views if counter in view)
        return info, routes

    def load_routed(self, info, how, views, agree, rank, map_location=None, verify=True, weights_only=True,
                    mmap=None, into=None):
        """This rank's part from its fastest valid copy: its own memory tier, then its partner's
        replica (every rank takes part in that exchange), then the tiers behind."""
        tiers = how[agree.rank][0] if how is not None else self._tiers_holding(info)
        if rank != self.rank:  # another rank's part, read by this process: the shared last tier alone
            tiers = tuple(i for i in tiers if i == len(self.tiers) - 1)
        ask = dict(map_location=map_location, verify=verify, weights_only=weights_only, mmap=mmap, into=into)
        state, tried, order = None, [], list(tiers)
        if order and order[0] == 0 and len(self.tiers) > 1:  # its own memory tier
            state = self._try(info, 0, rank, tried, ask)
            order = order[1:]
        if how is not None and self._replicas is not None:  # every rank: who asks its partner now
            fetched = self._replicas.fetch(info, how, state is None, tried, self._read_replica, ask)
            state = state if state is not None else fetched
        for i in order:
            if state is not None:
                break
            state = self._try(info, i, rank, tried, ask)
        if state is None:
            raise CorruptCheckpointError(f"rank {rank}'s part of step {info.step}: no copy verifies "
                                         f"({'; '.join(tried) or 'none held'})")
        return state

    def read_from(self, info: CommitInfo, rank: int) -> str:
        with self._lock:
            last = next((r for r in reversed(self.reads) if r.step == info.step and r.rank == rank), None)
        return last.tier if last is not None else info.path

    def _tiers_holding(self, info: CommitInfo) -> tuple[int, ...]:
        return tuple(i for i, _ in self._copies(info))

    def _try(self, info: CommitInfo, i: int, rank: int, tried: list, ask: dict):
        """This rank's part from tier i (None: not there, or it does not verify: said)."""
        copy = next((c for j, c in self._copies(info) if j == i), None)
        if copy is None:
            return None
        path = copy.file_for(rank)
        crc = copy.entry_for(rank).crc32 if ask["verify"] else None
        try:
            if i < len(self.tiers) - 1:  # a memory tier: its file is written over once recycled
                state = load_lent(copy.path, path, expect_crc=crc, **ask)
            else:
                state = self.tiers[i].load(copy, rank, **ask)
        except (CorruptCheckpointError, OSError) as e:
            self._said(f"rank {rank}'s part of step {info.step} in the tier {self.places[i]} ({path}) does not "
                       f"verify: {e}; trying the next copy", tried, f"{self.places[i]}: {e}")
            return None
        with self._lock:
            self.reads.append(Read(info.step, rank, self.places[i], path))
        return state

    def _read_replica(self, info: CommitInfo, path: str, partner: int, tried: list, ask: dict):
        """The part the partner sent, now at path in this rank's memory tier (None: it does not verify)."""
        try:
            state = load_lent(os.path.dirname(path), path, committed=False,  # committed once read
                              expect_crc=info.entry_for(self.rank).crc32 if ask["verify"] else None, **ask)
        except (CorruptCheckpointError, OSError) as e:
            self._said(f"rank {self.rank}'s part of step {info.step}, the replica kept by rank {partner} in its "
                       f"memory tier {self.places[0]}, does not verify: {e}; trying the next copy", tried,
                       f"replica of rank {partner}: {e}")
            return None
        with self._lock:
            self.reads.append(Read(info.step, self.rank, f"replica of rank {partner}", path))
        return state

    @staticmethod
    def _said(text: str, tried: list, short: str) -> None:
        tried.append(short)
        log.warning("fastckpt: %s", text)
        warnings.warn(f"fastckpt: {text}", stacklevel=4)

    def load(self, info: CommitInfo, rank: int, map_location=None, verify: bool = True, weights_only: bool = True,
             mmap=None, into=None):
        """This rank's part, from the fastest tier whose copy verifies (no exchange with other ranks)."""
        return self.load_routed(info, None, [], _Alone(), rank, map_location, verify, weights_only, mmap, into)

