"""A memory tier in front of checkpoints named by path (settings `tiers=[memory]` with store='path':
Lightning's `.ckpt` paths through FastCheckpointIO, DeepSpeed's tag files) — local paths, or s3://
ones (a Lightning dirpath in a bucket). The composition, the room check and retention are
fastckpt.store.tiers'; this module is what the caller's paths add.

Saving: `save(state, path)` commits in this process's folder of the memory tier first —
TIER/rank-R/step-N.cK/ (R: the job's global rank; these checkpoints are each process's own), a
TARGET file in it naming the path — at memory speed (fastckpt.store.node_tier: written through a
mapping on tmpfs, recycled files). Once committed there it is persisted to the path from that
committed copy, checked against its record first (fastckpt.commit.persist_unit with a PathTier
behind: as the path store writes, a hidden sibling renamed over the name once durable; at an
s3:// path an ObjectPath: uploaded to the object through the S3 store's client, then its commit
record, fastckpt.store.s3.object_path); the folder's index of persisted paths (`.persisted/`, one
small file per path, its last few saves) notes which save the path holds — its commit time and
counter — and that file (inode, size, modification time; a rename keeps them); an object's commit
record names its save itself, and the index notes a copy to it begun and landed (`held_now`). Every save of a path is copied there, in order — none is superseded by a newer one
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
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..commit.committed_under import CommittedUnder
from ..commit import record as commit
from ..commit.record import present as record_present
from ..commit_info import CommitInfo
from ..errors import CheckpointWriteError, ConfigError, CorruptCheckpointError
from .node_tier import RANK_RE, NodeTier, load_lent
from .path_store import PathStore, is_remote, local_path, local_target, sweep_dead_tmp
from .path_tier import PathTier, matches, note_name, read_notes, read_small, stamp
from .s3.object_path import ObjectPath
from .s3.place import is_s3
from .protocol import ByPath
from .tiers import CopyPlan, Tiers
from .url_files import AS_AWS_TOOLS, MARKER_SUFFIX, Remote, object_of, record_bytes

TARGET, PERSISTED = "TARGET", ".persisted"  # a copy's path; a folder's index of what each path holds


@dataclass(frozen=True)
class NamedRead:
    """One load by path: where it was read from ("memory" or "disk") and the file read."""

    path: str
    tier: str
    file: str


class NamedTiers(Tiers, ByPath):
    """A memory tier in front of the caller's paths (see the module docstring)."""

    kind = "path"
    survey_kind = "files"
    root = None
    names_by_path = True
    places_loosely = True
    alone = "their paths"
    where_short = ""  # each process's own tier
    part_rank = 0  # each process's checkpoints are its own: one part each

    def __init__(self, memory: str, keep: int, rank: int, direct_io: bool = True, remote: Remote = AS_AWS_TOOLS):
        # this process's folder (its checkpoints: one part each), then the paths
        self.remote = remote  # how s3:// paths are reached
        super().__init__([NodeTier(memory, rank), PathStore(per_rank=False, remote=self.remote)], (keep, 1), rank,
                         direct_io)
        self.keep = keep
        self.reads: list[NamedRead] = []
        self.pointers = False  # ByPath's (pool pointers): nothing here
        self._removed: set[str] = set()  # paths removed since their last save

    @property
    def memory(self) -> NodeTier:
        return self.tiers[0]

    @property
    def disk(self) -> PathStore:
        return self.last

    @classmethod
    def open(cls, config, rank: int, world_size: int) -> "NamedTiers":
        if world_size > 1:
            raise ConfigError("tiers in front of checkpoints that every rank saves together (per_rank) are not "
                              "supported; each process's own paths are (FastCheckpointIO without per_rank, DeepSpeed)")
        import torch.distributed as dist
        global_rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        return cls(config.tiers[0], config.keep_on_tiers()[0], global_rank, config.direct_io, Remote.of(config))

    def waiting(self) -> int:
        """Every copy handed over and not landed, counting the one being copied (none gives way to a
        newer one). Read without the lock (a save asks; len() of a set is atomic)."""
        return len(self._held)

    # -- 1-4. writing and committing --------------------------------------------
    def begin(self, step, counter, rank, fmt, target=None, plan=None, meta=None):
        target = os.fspath(target)
        if self.on_last:
            return self.disk.begin(step, counter, rank, fmt, target, plan, meta)
        if is_s3(target):
            object_of(target, self.remote)  # a bad URL: said now
        elif is_remote(target):
            raise CheckpointWriteError(f"a memory tier in front of a URL other than s3:// ({target}) is not "
                                       "supported; save to s3://, or to a local or mounted path")
        else:
            target = local_target(target)
            sweep_dead_tmp(os.path.dirname(target))  # what a copy to a path cut short by a kill left there
        ckpt_id, part = self.memory.begin(step, counter, 0, fmt)
        with open(os.path.join(ckpt_id, TARGET), "w", encoding="utf-8") as f:
            f.write(target)
        with self._lock:
            self._removed.discard(target)
        return ckpt_id, part

    def plan_copy(self, info: CommitInfo) -> CopyPlan:
        """The copy of a memory copy to its path, spared from retention from the hand-over on. At
        its turn it goes unless its path was removed meanwhile (then it is un-committed and
        nothing is written): every save of a path reaches it, none gives way to a newer one."""
        target = read_small(os.path.join(info.path, TARGET))
        if not target:
            raise CheckpointWriteError(f"{info.path}: its {TARGET} file is missing: the path it is a copy of is unknown")

        seen: dict = {}  # what ready() saw, under the lock, for refused()

        def ready() -> bool:  # under the lock: a removal marks the path, then withdraws the copy
            seen.update(removed=target in self._removed, there=bool(record_present(info.path)))
            return seen["there"] and not seen["removed"]

        def refused() -> bool:
            with self._lock:  # its owner removed the path (then, or since): nothing to write
                if seen.get("removed") or target in self._removed:
                    return False
            # not removed by its owner, yet not copied: the path never gets this save. Never silent
            # (a superseded copy is counted, not reported): the checkpoint it was is lost on disk.
            raise CheckpointWriteError(
                f"the save of {target} was not persisted: "
                + ("its memory copy at " + info.path + " was gone before its turn" if not seen.get("there")
                   else "another rank no longer had its memory copy, or had removed the path")
                + "; the path keeps what it held before")

        index = os.path.join(self.memory.root, PERSISTED)
        behind = (ObjectPath(target, index, self._place, self.remote) if is_s3(target) else
                  PathTier(target, index, self._place))
        return CopyPlan([behind], ready, refused, spared=frozenset({info.path}))

    def _place(self, target: str, land: Callable[[], None]) -> bool:
        """A durable copy made its path's (land: a rename, or an object's record) — unless the path
        was removed meanwhile (False). Under the lock remove_path holds: a removal and a copy
        landing never interleave."""
        with self._lock:
            if target in self._removed:
                return False
            land()
            return True

    @staticmethod
    def key_of(path) -> str:
        """A path as a memory copy's TARGET names it (an s3:// URL as it is)."""
        return os.fspath(path) if is_s3(path) else local_path(path)

    def in_front(self, path) -> bool:
        """Whether the memory tier may hold copies of path (a local path, or an s3:// one)."""
        return is_s3(path) or not is_remote(path)

    # -- 5. listing -------------------------------------------------------------
    def committed(self, problems: Optional[list] = None) -> list[CommitInfo]:
        return []  # read by path (load_path), never by the Checkpointer's load()

    # -- ByPath -----------------------------------------------------------------
    def prepare_path(self, path: str) -> None:
        self.disk.prepare_path(path)

    def mark_durable(self, path: str) -> None:
        pass

    def size_of(self, path: str) -> Optional[int]:
        source = self.source_of(self.key_of(path)) if self.in_front(path) else None
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
        key = self.key_of(path)
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

    def held_now(self, key: str, copies: list) -> Optional[dict]:
        """Which save the path `key` holds now: None (nothing there); {"save": (time, counter)} — a save
        of this tier (a local file its index notes; an s3:// object whose commit record names it: the
        record holds the memory copy's commit time and counter); {"since": seconds} — something else,
        that old (a local file's modification time; another writer's record's time; an object without
        a record: its whole-second modification time plus that second); {"pending": True} — an
        s3:// object without a record while this tier's copy to it is on its way or was cut short."""
        if not is_s3(key):
            now = stamp(key)
            if now is None:
                return None
            note = self.on_disk(key, now)
            return {"since": now["mtime_ns"] / 1e9} if note is None else {"save": (note.get("time"), note.get("counter"))}
        raw = record_bytes(key, self.remote)
        try:
            record = commit.decode(raw, key + MARKER_SUFFIX) if raw is not None else None
        except CorruptCheckpointError:
            record = None
        if record is not None:
            if any((c.time, c.counter) == (record.time, record.counter) for c, _ in copies):
                return {"save": (record.time, record.counter)}
            return {"since": record.time}
        if self.copying(key):
            return {"pending": True}
        bucket, name = object_of(key, self.remote)
        now = bucket.stamp(name)
        # an object's modification time is whole seconds (HTTP's Last-Modified) of the server's clock:
        # within a second of a copy's commit, the object is taken as newer (a memory copy never stands
        # in for a newer object; the server's clock is taken to be this node's within that second)
        return None if now is None else {"since": now["mtime_ns"] / 1e9 + 1.0}

    def copying(self, key: str) -> bool:
        """Whether this node's newest index note of the s3:// path says a copy to it began and has
        not landed (fastckpt.store.s3.object_path notes both)."""
        for tier in self._folders():
            notes = read_notes(os.path.join(tier.root, PERSISTED, note_name(key)), key)
            if notes and "pending" in notes[-1]:
                return True
        return False

    def copy_of(self, path: str) -> Optional[str]:
        """The memory copy (a file) that is the file at path now, byte for byte (the save the
        index, or the object's record, says it holds); None when there is none on this node."""
        key = self.key_of(path)
        copies = self.copies_of(key)
        now = self.held_now(key, copies) if copies else None
        if now is None or "save" not in now:
            return None
        return next((file for info, file in copies if (info.time, info.counter) == tuple(now["save"])), None)

    def source_of(self, key: str) -> Optional[tuple[CommitInfo, str]]:
        """The memory copy to read for the path `key` (None: the path itself): the newest copy of
        it, when the path holds a save of this tier no newer than it, or something else older than
        it, or nothing yet (see the module docstring)."""
        copies = self.copies_of(key)
        if not copies:
            return None
        info, file = copies[0]
        now = self.held_now(key, copies)
        if now is None or "pending" in now:
            return info, file
        if "save" in now:
            return (info, file) if info.time >= (now["save"][0] or float("inf")) else None
        return (info, file) if info.time > now["since"] else None

    def load_path(self, path: str, rank: int, map_location=None, verify: bool = True, weights_only: bool = True,
                  mmap: Optional[bool] = None):
        key = self.key_of(path) if self.in_front(path) else None
        source = self.source_of(key) if key is not None else None
        if source is not None:
            info, file = source
            try:
                state = load_lent(info.path, file, map_location=map_location, verify=True, weights_only=weights_only,
                                  expect_crc=info.files[0].crc32)
                self.reads.append(NamedRead(key, "memory", file))
                return state
            except (CorruptCheckpointError, OSError) as e:
                warnings.warn(f"fastckpt: the memory tier's copy of {key} ({file}) does not verify "
                              f"({e}); reading {key} instead", stacklevel=4)
        self.reads.append(NamedRead(path, "disk", path))
        return self.disk.load_path(path, rank, map_location, verify, weights_only, mmap)

    def remove_path(self, path: str, later: Optional[Callable[[Callable[[], None]], Any]] = None) -> None:
        if self.in_front(path):
            key = self.key_of(path)
            with self._lock:  # no copy lands at the path from here on (_place)
                self._removed.add(key)
                unpersisted = set(self._held)
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
