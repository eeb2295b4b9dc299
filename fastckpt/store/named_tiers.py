"""A memory tier in front of checkpoints named by path (settings `tiers=[memory]` with store='path':
Lightning's `.ckpt` paths through FastCheckpointIO, DeepSpeed's tag files).

Saving: `save(state, path)` commits in this process's folder of the memory tier first —
TIER/rank-R/step-N.cK/ (R: the job's global rank; these checkpoints are each process's own), a
TARGET file in it naming the path — at memory speed (fastckpt.store.node_tier: written through a
mapping on tmpfs, recycled files). Once committed there it is persisted to the path from that
committed copy, checked against its record first (fastckpt.commit.persist_unit with a PathTier
behind: as the path store writes, a hidden sibling renamed over the name once durable); the
folder's index of persisted paths (`.persisted/`, one small file per path, its last few saves)
notes, just before the rename, which save the path is about to hold — its commit time and
counter — and that file: inode, size, modification time (a rename keeps them). Every save of a path is copied there, in order — none is superseded by a newer one
(a DeepSpeed tag's or a DCP checkpoint's record waits for its files there, and each name a
framework saved must reach its disk); a disk slower than the saves holds more copies in memory,
which the memory bound counts.

Loading: `load_path(path)` reads the newest committed memory copy of the path (in any rank's
folder of this node) when the file at the path is a save of this tier no newer than it (an index
note matches the file) — the same save, or an older one whose newer saves were not yet copied
there (cut short by a kill, or a disk behind) — or, when the file is none of this tier's, when the
copy is newer than the file; every CRC is checked, and one that fails is named in a warning and
the path is read instead. Otherwise the path is read: a memory copy never stands in for a newer
file (the path saved again by another writer). `reads` says where each load came from. (Frameworks that find
their checkpoints by listing the disk — Lightning's "last", DeepSpeed's `latest` — find a path
only once it was persisted there.)

Removing a path removes this process's memory copies of it (one whose copy to the path is
waiting or running is un-committed at once and never written there; retention removes its files
once that copy landed). Retention: the memory tier's `tier_keep` newest committed copies,
never one not yet persisted. Memory: checked at every save (`bounded`); without room, saves go
to their paths alone from then on, with one warning; after `hurry()` (a preemption) too.
"""
from __future__ import annotations

import os
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..commit.committed_under import CommittedUnder
from ..commit.persist_unit import PersistCommit
from ..commit.record import present as record_present
from ..commit_info import CommitInfo
from ..errors import CheckpointWriteError, ConfigError, CorruptCheckpointError
from .node_tier import RANK_RE, NodeTier, load_lent
from .path_store import PathStore, is_remote, local_path, local_target, sweep_dead_tmp
from .path_tier import PathTier, matches, note_name, read_notes, read_small, stamp
from .protocol import ByPath, Store
from .tier_copy import copy_part

TARGET, PERSISTED = "TARGET", ".persisted"  # a copy's path; a folder's index of what each path holds


@dataclass(frozen=True)
class NamedRead:
    """One load by path: where it was read from ("memory" or "disk") and the file read."""

    path: str
    tier: str
    file: str


class NamedTiers(Store, ByPath):
    """A memory tier in front of the caller's paths (see the module docstring)."""

    kind = "path"
    survey_kind = "files"
    root = None
    names_by_path = True
    every_rank_retains = True  # each process's memory folder is its own
    places_loosely = True

    def __init__(self, memory: str, keep: int, rank: int, direct_io: bool = True):
        self.memory = NodeTier(memory, rank)  # this process's folder (its checkpoints: one part each)
        self.disk = PathStore(per_rank=False)
        self.keep, self.rank, self.direct_io = keep, rank, direct_io
        self.reads: list[NamedRead] = []
        self.pointers = False  # ByPath's (pool pointers): nothing here
        self._to_disk = False  # hurried (a preemption) or shrunk (no room): saves go to their paths alone
        self._lock = threading.Lock()
        self._unpersisted: set[str] = set()  # memory folders handed over, not landed: never retained
        self._removed: set[str] = set()  # paths removed since their last save

    @classmethod
    def open(cls, config, rank: int, world_size: int) -> "NamedTiers":
        if world_size > 1:
            raise ConfigError("tiers in front of checkpoints that every rank saves together (per_rank) are not "
                              "supported; each process's own paths are (FastCheckpointIO without per_rank, DeepSpeed)")
        import torch.distributed as dist
        global_rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        return cls(config.tiers[0], config.keep_on_tiers()[0], global_rank, config.direct_io)

    # -- 0. opening -------------------------------------------------------------
    def prepare(self) -> None:
        self.memory.prepare()
        self.memory.remove_uncommitted()

    def remove_uncommitted(self) -> None:
        pass  # this process's memory folder: in prepare()

    def next_counter(self) -> int:
        return self.memory.next_counter()

    @property
    def bounded(self) -> bool:
        return not self._to_disk

    def fits(self, nbytes: int, concurrency: int) -> bool:
        """Room for the memory tier's keep, the saves in flight, the copies waiting and one more."""
        if self._to_disk:
            return True
        with self._lock:
            waiting = len(self._unpersisted)
        return self.memory.has_room((self.keep + concurrency + waiting + 1) * nbytes)

    def shrink(self, nbytes: int, concurrency: int) -> str:
        self._to_disk = True
        return (f"the memory tier {self.memory.place} has no room for {self.keep} + {concurrency} + 1 checkpoints of "
                f"{nbytes / 2**20:.0f} MiB; checkpoints go to their paths alone")

    def hurry(self) -> None:
        self._to_disk = True

    @property
    def sink_kind(self) -> str:
        return "file" if self._to_disk else self.memory.sink_kind

    # -- 1-4. writing and committing --------------------------------------------
    def _in_memory(self, ckpt_id: Optional[str]) -> bool:
        return ckpt_id is not None and os.path.dirname(os.path.abspath(ckpt_id)) == self.memory.root

    def begin(self, step, counter, rank, fmt, target=None, plan=None, meta=None):
        target = os.fspath(target)
        if self._to_disk:
            return self.disk.begin(step, counter, rank, fmt, target, plan, meta)
        if is_remote(target):
            raise CheckpointWriteError(f"a memory tier in front of a URL ({target}) is not supported; "
                                       "save to a local or mounted path")
        target = local_target(target)
        sweep_dead_tmp(os.path.dirname(target))  # what a copy to a path cut short by a kill left there
        ckpt_id, part = self.memory.begin(step, counter, 0, fmt)
        with open(os.path.join(ckpt_id, TARGET), "w", encoding="utf-8") as f:
            f.write(target)
        with self._lock:
            self._removed.discard(target)
        return ckpt_id, part

    def sink(self, part: str, direct_io: bool):
        if self._in_memory(os.path.dirname(part)):
            return self.memory.sink(part, direct_io)
        return self.disk.sink(part, direct_io)

    def commit_file(self, ckpt_id, part, result):
        return (self.memory if self._in_memory(ckpt_id) else self.disk).commit_file(ckpt_id, part, result)

    def commit_rank(self, ckpt_id, info) -> None:
        (self.memory if self._in_memory(ckpt_id) else self.disk).commit_rank(ckpt_id, info)

    def commit(self, info) -> None:
        (self.memory if self._in_memory(info.path) else self.disk).commit(info)

    def abort(self, ckpt_id, part, rank: int, stuck: bool = False) -> None:
        (self.memory if self._in_memory(ckpt_id) else self.disk).abort(ckpt_id, part, rank, stuck)

    def persist_unit(self, info: CommitInfo, landed, retain, agree_all):
        """The copy of a memory copy to its path; None for a save that went to its path directly."""
        if not self._in_memory(info.path):
            return None
        target = read_small(os.path.join(info.path, TARGET))
        if not target:
            raise CheckpointWriteError(f"{info.path}: its {TARGET} file is missing: the path it is a copy of is unknown")
        with self._lock:
            self._unpersisted.add(info.path)

        def go(unit) -> bool:  # a path removed meanwhile is not written (its copy is un-committed)
            with self._lock:  # both under the lock: a removal marks the path, then withdraws the copy
                removed = target in self._removed
                there = record_present(info.path)
            if agree_all(there and not removed):
                return True
            with self._lock:
                if removed or target in self._removed:  # its owner removed the path: nothing to write
                    return False
            # not removed by its owner, yet not copied: the path never gets this save. Never silent
            # (a superseded copy is counted, not reported): the checkpoint it was is lost on disk.
            raise CheckpointWriteError(
                f"the save of {target} was not persisted: "
                + ("its memory copy at " + info.path + " was gone before its turn" if not there else
                   "another rank no longer had its memory copy, or had removed the path")
                + "; the path keeps what it held before")

        def done(unit, infos, error):
            with self._lock:
                self._unpersisted.discard(info.path)
            landed(unit, infos, error)

        return PersistCommit(info, 0, [PathTier(target, os.path.join(self.memory.root, PERSISTED), self._place)],
                             self._copy, go, done, retain)

    def _copy(self, tier, src: str, folder: str, entry) -> None:
        """One memory copy made durable in the folder beside its path (renamed over it by PathTier)."""
        copy_part(src, os.path.join(folder, entry.name), entry, self.direct_io)

    def _place(self, part: str, target: str) -> bool:
        """A durable copy renamed over its path — unless the path was removed meanwhile (False).
        Under the lock remove_path holds: a removal and a copy landing never interleave."""
        with self._lock:
            if target in self._removed:
                return False
            os.replace(part, target)
            return True

    # -- 5-7. listing, retention -------------------------------------------------
    def committed(self, problems: Optional[list] = None) -> list[CommitInfo]:
        return []  # read by path (load_path), never by the Checkpointer's load()

    def retain(self, keep: int, in_flight: set) -> None:
        """The memory tier's own keep (`keep`, the Checkpointer's, means nothing for named paths);
        never a copy in flight or not yet persisted."""
        with self._lock:
            held = set(in_flight) | self._unpersisted
        self.memory.retain(self.keep, held)

    def retain_behind(self, in_flight: set) -> None:
        self.retain(self.keep, in_flight)

    def close(self) -> None:
        self.memory.close()
        self.disk.close()

    # -- ByPath -----------------------------------------------------------------
    def prepare_path(self, path: str) -> None:
        self.disk.prepare_path(path)

    def mark_durable(self, path: str) -> None:
        pass

    def size_of(self, path: str) -> Optional[int]:
        source = None if is_remote(path) else self.source_of(local_path(path))
        return source[0].files[0].bytes if source is not None else self.disk.size_of(path)

    def _folders(self, own_only: bool = False) -> list[NodeTier]:
        """This process's memory folder, then (unless own_only) every other rank's on this node."""
        folders = [self.memory]
        if not own_only and os.path.isdir(self.memory.place):
            for name in sorted(os.listdir(self.memory.place)):
                m = RANK_RE.match(name)
                if m and int(m.group(1)) != self.rank:
                    folders.append(NodeTier(self.memory.place, int(m.group(1))))
        return folders

    def copies_of(self, path: str, own_only: bool = False) -> list[tuple[CommitInfo, str]]:
        """(record, file) of each committed memory copy of path, newest first (by commit time)."""
        key = local_path(path)
        out = []
        for tier in self._folders(own_only):
            for info in tier.committed():
                if read_small(os.path.join(info.path, TARGET)) == key:
                    out.append((info, os.path.join(info.path, info.files[0].name)))
        return sorted(out, key=lambda c: -c[0].time)

    def on_disk(self, key: str, now: Optional[dict]) -> Optional[dict]:
        """The index note of the save of this tier that the file at key is now (None: it is none
        of this tier's saves, or there is no file)."""
        for tier in self._folders():
            for note in read_notes(os.path.join(tier.root, PERSISTED, note_name(key)), key):
                if matches(note, now):
                    return note
        return None

    def copy_of(self, path: str) -> Optional[str]:
        """The memory copy (a file) that is the file at path now, byte for byte (the save the
        index notes it holds); None when there is none on this node."""
        key = local_path(path)
        note = self.on_disk(key, stamp(key))
        if note is None:
            return None
        return next((file for info, file in self.copies_of(key)
                     if info.time == note.get("time") and info.counter == note.get("counter")), None)

    def source_of(self, key: str) -> Optional[tuple[CommitInfo, str]]:
        """The memory copy to read for the path `key` (None: the path itself): the newest copy of
        it, when the file at the path is a save of this tier no newer than it, or none of this
        tier's and older than it (see the module docstring)."""
        copies = self.copies_of(key)
        if not copies:
            return None
        info, file = copies[0]
        now = stamp(key)
        if now is None:
            return info, file
        note = self.on_disk(key, now)
        if note is not None:
            return (info, file) if info.time >= note.get("time", float("inf")) else None
        return (info, file) if info.time > now["mtime_ns"] / 1e9 else None

    def load_path(self, path: str, rank: int, map_location=None, verify: bool = True, weights_only: bool = True,
                  mmap: Optional[bool] = None):
        source = None if is_remote(path) else self.source_of(local_path(path))
        if source is not None:
            info, file = source
            try:
                state = load_lent(info.path, file, map_location=map_location, verify=True, weights_only=weights_only,
                                  expect_crc=info.files[0].crc32)
                self.reads.append(NamedRead(local_path(path), "memory", file))
                return state
            except (CorruptCheckpointError, OSError) as e:
                warnings.warn(f"fastckpt: the memory tier's copy of {local_path(path)} ({file}) does not verify "
                              f"({e}); reading {local_path(path)} instead", stacklevel=4)
        self.reads.append(NamedRead(path, "disk", path))
        return self.disk.load_path(path, rank, map_location, verify, weights_only, mmap)

    def remove_path(self, path: str, later: Optional[Callable[[Callable[[], None]], Any]] = None) -> None:
        if not is_remote(path):
            key = local_path(path)
            with self._lock:  # no copy lands at the path from here on (_place)
                self._removed.add(key)
                unpersisted = set(self._unpersisted)
                self.disk.remove_path(path, later)
            try:  # what the index says the path holds: nothing now
                os.unlink(os.path.join(self.memory.root, PERSISTED, note_name(key)))
            except OSError:
                pass
            for info, _ in self.copies_of(key, own_only=True):
                if info.path in unpersisted:  # its copy to the path may be reading it: un-committed now
                    CommittedUnder(self.memory.root).withdraw(info.path)  # (never served again), its
                else:  # files removed by retention once the copy landed (and wrote nothing there)
                    self.memory.remove(info.path)
            return
        self.disk.remove_path(path, later)
