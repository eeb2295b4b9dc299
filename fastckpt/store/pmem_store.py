"""The pmem store: the Checkpointer's checkpoints as versions of a model in a pool.

ROOT is the pool (a file, a file on an fsdax mount, /dev/daxN.M, or a file on /dev/shm);
`model` names this run's model in it (one per rank when several ranks save: MODEL/rank-R).
model=None: every save names its model by the path it is given (Lightning's `.ckpt` paths
become models of the pool; load_named / drop_named read and remove them).
Each model has concurrency + 1 version slots (two for concurrency 1: Portus' double
mapping; PCcheck's N + 1 otherwise). A save claims the oldest slot that is neither the
current version nor in flight, copies the tensors straight into it, persists, seals the
slot, and once every rank has sealed its part each rank flips its model's active word.

Recovery (committed()): a step is loadable when every rank has a sealed version of it and
it is not newer than the newest active word of any rank (a rank flips only after all
ranks' parts are durable, so an active word anywhere vouches for all of them). Newest
first; the Checkpointer's load falls back to older ones if one fails its CRCs.
"""
from __future__ import annotations

import json
import os
import threading
import time
import zlib
from types import SimpleNamespace
from typing import Optional

from ..commit_info import CommitInfo, FileEntry
from ..errors import ConfigError, CorruptCheckpointError
from ..pmem import layout as L
from ..pmem.image import read_version
from ..pmem.pool import Pool, Version, check_device_path, is_blank
from ..pmem.pointer import is_pool_pointer, write_pointer
from ..write.pinning import unregister
from ..write.protocol import MappedSink, WriteResult
from . import path_store
from .protocol import ByPath, Store


POOL_NAME = "fastckpt.pool"  # the pool's name when root is a directory
HEADROOM = 1.25  # a pool sized at the first save holds the slots' versions and this much more


STRATEGY_NOTE = ("fastckpt: store='pmem' stores every snapshot straight into the pool (the pool is the "
                 "staging: no staging chunks, no spare-memory copy; the gate waits until the tensors are in "
                 "the pool), so strategy={!r} changes nothing there (left at its default, 'c', it is not said)")


class PmemStore(Store, ByPath):
    kind = "pmem"
    survey_kind = "pool"  # `fastckpt ls` lists a pool's models itself (fastckpt.pmem.commands)
    layout_format = "safetensors"  # what the pool keeps, whatever the Checkpointer's format
    sink_kind = "mapped"  # tensors go straight into the pool: no staging
    allow_pickle = True  # like torch.save: other values are pickled, loaded by the restricted unpickler

    def __init__(self, config, rank: int = 0, world_size: int = 1):
        """config: the Checkpointer's settings (root: the pool; model, pool_mb, persist, concurrency)."""
        root, model, concurrency = config.root, config.model, config.concurrency
        if root is None:
            raise ConfigError("store='pmem' needs root=<the pool: a file, /dev/daxN.M, or a file on /dev/shm>")
        if not 1 <= concurrency < L.SLOTS:
            raise ConfigError(f"store='pmem' allows concurrency 1..{L.SLOTS - 1} "
                              f"(a model has {L.SLOTS} version slots), got {concurrency}")
        self.root = os.path.abspath(os.fspath(root))
        if os.path.isdir(self.root):
            self.root = os.path.join(self.root, POOL_NAME)
        check_device_path(self.root)
        self.model, self.pool_mb, self.persist = model, config.pool_mb, config.persist
        self.slots = concurrency + 1
        self.world_size = world_size
        self.named = self.names_by_path = model is None
        if not self.named:
            L.encode_name(self.model_of(world_size - 1))  # a bad name fails here, not at the first save
        self.pool: Pool | None = None
        self._busy: dict[int, set[int]] = {}  # entry -> slots in flight
        self._claims: dict[str, tuple[int, int, L.Slot, bytes]] = {}
        self._lock = threading.Lock()

    @classmethod
    def open(cls, config, rank: int, world_size: int) -> "PmemStore":
        return cls(config, rank, world_size)

    def strategy_note(self, strategy: str) -> Optional[str]:
        return STRATEGY_NOTE.format(strategy) if strategy != "c" else None

    # -- the command's view: a pool is listed by fastckpt.pmem.commands ---------------
    @classmethod
    def place_at(cls, path: str) -> Optional["PmemStore"]:
        """A pool: the file (or DAX device), or a folder holding fastckpt.pool."""
        from ..pmem.commands import is_pool
        for candidate in (path, os.path.join(path, POOL_NAME)):
            if os.path.exists(candidate) and not os.path.isdir(candidate) and is_pool(candidate):
                # opened to read (the settings sit above the stores; reading needs only where it is)
                store = cls(SimpleNamespace(root=candidate, model=None, pool_mb=None, persist="auto", concurrency=1))
                store.place = store.root
                return store
        return None

    # -- ByPath: the pool's models named by path ---------------------------------
    def prepare_path(self, path: str) -> None:
        pass  # the model is made by the save

    def mark_durable(self, path: str) -> None:
        write_pointer(path, self.root, self.name_of(path))

    def load_path(self, path: str, rank: int, map_location=None, verify: bool = True, weights_only: bool = True,
                  mmap: Optional[bool] = None):
        if self.pointers and not is_pool_pointer(path):  # a file another writer left there
            return path_store.read_path(path, rank, map_location, verify, weights_only, mmap)
        return self.load_named(path, rank, map_location, verify, weights_only)

    def size_of(self, path: str) -> Optional[int]:
        return self.named_size(path)

    def remove_path(self, path: str, later=None) -> None:
        """The model dropped; a pointer file (or any file) at path removed too."""
        self.drop_named(path)
        if path_store.is_remote(path) or os.path.lexists(path_store.local_path(path)):
            path_store.remove(path, later)

    def model_of(self, rank: int, world_size: int | None = None, model: str | None = None) -> str:
        model = self.model if model is None else model
        return model if (world_size or self.world_size) == 1 else f"{model}/rank-{rank}"

    def name_of(self, target) -> str:
        """The model a path-named save goes to: the absolute path, or its tail and a CRC when long."""
        name = os.path.abspath(os.fspath(target))
        room = L.NAME_MAX - 16
        if len(name.encode()) > room:
            tail = name.encode()[-(room - 10):].decode(errors="ignore")
            name = f"~{zlib.crc32(name.encode()):08x}~{tail}"
        return name

    def _saved_world(self, pool: Pool) -> int:
        """How many ranks saved this model: this job's, or for a single process reading a
        multi-rank job's pool, the number of MODEL/rank-R models present."""
        if self.world_size > 1 or pool.find(self.model) is not None:
            return self.world_size
        names, n = pool.models(), 0
        while f"{self.model}/rank-{n}" in names:
            n += 1
        return max(n, 1)

    def _open(self, create: bool, need: int = 0) -> Pool | None:
        """The pool; a missing one is created when asked (sized from pool_mb, or from `need`,
        one version's bytes, when pool_mb is None); None when missing and not needed yet."""
        if self.pool is None:
            if create:
                auto = max(L.MIN_POOL, L.HEAP_OFF + int(need * self.slots * self.world_size * HEADROOM))
                self.pool = Pool(self.root, self.pool_mb or -(-auto >> 20), self.persist)
            elif os.path.exists(self.root) and not is_blank(self.root):  # blank: a creation cut short
                self.pool = Pool(self.root, None, self.persist, create=False)
        return self.pool

    # -- the store protocol (see RootStore) ---------------------------------
    def prepare(self) -> None:
        parent = os.path.dirname(self.root)
        if not os.path.isdir(parent):
            raise FileNotFoundError(f"cannot create pool {self.root!r}: directory {parent!r} does not exist")
        self._open(create=self.pool_mb is not None)

    def next_counter(self) -> int:
        pool = self._open(create=False)
        if pool is None:
            return 1
        # path-named: counters order saves across every model this process may write
        names = list(pool.models()) if self.named else [self.model_of(r) for r in range(self.world_size)]
        return 1 + max([0] + [pool.top_counter(n) for n in names])

    def remove_uncommitted(self) -> None:
        pass  # an unsealed slot is invisible and is the next one claimed

    def retain(self, keep: int, in_flight: set) -> None:
        pass  # a model never has more than concurrency + 1 versions

    def begin(self, step: int, counter: int, rank: int, fmt: str, target=None, plan=None, meta=None):
        if (target is not None) != self.named:
            raise ValueError("this pool store names models by save(..., path=...)" if self.named else
                             f"this pool store saves model {self.model!r}; save(..., path=...) needs model=None")
        extra = json.dumps(meta or {}, sort_keys=True).encode()
        pool = self._open(create=True, need=plan.data_end + len(extra) + 2 * L.ALIGN)
        model = self.model_of(rank, model=self.name_of(target) if self.named else None)
        i = pool.ensure_model(model)
        with self._lock:
            busy = self._busy.setdefault(i, set())
            s, desc = pool.claim(i, self.slots, busy, plan.data_begin + len(extra), plan.data_end - plan.data_begin)
            busy.add(s)
        desc.counter, desc.step, desc.rank, desc.world_size = counter, step, rank, self.world_size
        desc.extra_len, desc.extra_crc = len(extra), zlib.crc32(extra)
        ckpt_id = f"{self.root}#{model}@{counter}"
        with self._lock:
            self._claims[ckpt_id] = (i, s, desc, extra)
        return ckpt_id, ckpt_id

    def sink(self, file_path: str, direct_io: bool) -> MappedSink:
        return MappedSink(self.pool, self._claims[file_path][2].data_off)

    def finish_write(self, write, file_path: str) -> WriteResult:
        """Data persistent -> header and meta persisted -> the slot sealed (not yet current)."""
        i, s, desc, extra = self._claims[file_path]
        result = write.finish()
        (off, header), = result.blobs
        if off != 0 or len(header) != write.plan.data_begin:
            raise ValueError("a pool version's header must be the image's first data_begin bytes")
        self.pool.write_at(desc.meta_off, header + extra)
        desc.meta_len, desc.data_len = len(header), write.plan.data_end - write.plan.data_begin
        desc.image_crc, desc.time = result.file_crc, time.time()
        self.pool.seal(i, s, desc)
        result.path, result.bytes = file_path, desc.meta_len + desc.data_len
        return result

    def commit_file(self, ckpt_id: str, file_path: str, result) -> str:
        return file_path

    def commit_rank(self, ckpt_id: str, info: CommitInfo) -> None:
        """Every rank, once all ranks' parts are sealed: this rank's model moves to it."""
        with self._lock:
            i, s, desc, _ = self._claims.pop(ckpt_id)
        self.pool.flip(i, s, desc.counter)
        with self._lock:
            self._busy[i].discard(s)

    def commit(self, info: CommitInfo) -> None:
        pass  # the active words are the commit; there is no separate record

    def abort(self, ckpt_id: str, file_path: str, rank: int, stuck: bool = False) -> None:
        """stuck: the write may still store into its slot, which then stays claimed and busy
        (no later save of this process and no repack reuses it)."""
        with self._lock:
            claim = self._claims.pop(ckpt_id, None) if ckpt_id is not None else None
            if claim is not None and not stuck:
                self._busy[claim[0]].discard(claim[1])  # never sealed, or sealed but never current
        if claim is not None and self.pool is not None and not stuck:
            self.pool.unclaim(claim[0], claim[1])  # torn if never sealed: repack may reclaim it

    def close(self) -> None:
        if self.pool is not None:
            unregister(self.pool.native.address)  # CUDA must not keep a registration of an unmapped range
            self.pool.close()
            self.pool = None

    # -- reading -------------------------------------------------------------
    def _rank_versions(self) -> tuple[list[dict[int, Version]], int]:
        pool = self._open(create=False)
        if pool is None:
            return [{} for _ in range(self.world_size)], 0
        per_rank, newest_active = [], 0
        world = self._saved_world(pool)
        for r in range(world):
            by_counter: dict[int, Version] = {}
            for v in pool.versions(self.model_of(r, world)):  # a repack cut short may leave two copies
                if v.counter not in by_counter or v.active:
                    by_counter[v.counter] = v
            per_rank.append(by_counter)
            i = pool.find(self.model_of(r, world))
            act = pool.active(i) if i is not None else None  # the word, even if its slot is damaged
            newest_active = max(newest_active, act[0] if act else 0)
        return per_rank, newest_active

    def committed(self, problems: list | None = None) -> list[CommitInfo]:
        if self.named:
            return []  # path-named models are read by path (load_named), as the path store's files are
        per_rank, newest_active = self._rank_versions()
        common = set(per_rank[0])
        for vs in per_rank[1:]:
            common &= set(vs)
        out = []
        for c in sorted((c for c in common if c <= newest_active), reverse=True):
            parts = [vs[c] for vs in per_rank]
            try:
                meta = self._extra(parts[0])
            except CorruptCheckpointError as e:
                if problems is not None:
                    problems.append(f"checkpoint {e} is invalid")
                continue
            files = tuple(FileEntry(f"{v.model}@{v.counter}", r, v.nbytes, v.desc.image_crc)
                          for r, v in enumerate(parts))
            out.append(CommitInfo(step=parts[0].step, path=f"{self.root}#{self.model}@{c}",
                                  bytes=sum(v.nbytes for v in parts), counter=c, time=parts[0].desc.time,
                                  world_size=len(parts), format="safetensors", files=files, meta=meta))
        return out

    def _extra(self, v: Version) -> dict:
        d = v.desc
        raw = self.pool.read_at(d.meta_off + d.meta_len, d.extra_len)
        if zlib.crc32(raw) != d.extra_crc:
            raise CorruptCheckpointError(f"{self.root}#{v.model}@{v.counter}: its saved meta is damaged")
        return json.loads(raw)

    def load_named(self, target, rank: int = 0, map_location=None, verify: bool = True,
                   weights_only: bool = True):
        """The newest loadable version of the model a path-named save wrote at `target`."""
        pool = self._open(create=False)
        model = self.model_of(rank, model=self.name_of(target))
        errors = []
        for v in pool.loadable(model) if pool is not None else []:
            try:
                return read_version(pool, v, map_location, verify, weights_only)
            except CorruptCheckpointError as e:
                errors.append(str(e))
        raise FileNotFoundError(f"no checkpoint {os.fspath(target)!r} in pool {self.root}"
                                + (f": {'; '.join(errors)}" if errors else ""))

    def named_size(self, target) -> int | None:
        """Bytes of the current version saved under `target` (None: nothing committed there)."""
        pool = self._open(create=False)
        vs = pool.loadable(self.name_of(target)) if pool is not None else []
        return vs[0].nbytes if vs and vs[0].active else None

    def drop_named(self, target) -> None:
        pool = self._open(create=False)
        if pool is not None:
            for r in range(self.world_size):
                pool.drop(self.model_of(r, model=self.name_of(target)))

    def verify(self, info: CommitInfo) -> None:
        for f in info.files:
            self.load(info, f.rank, None, True, True)

    def load(self, info: CommitInfo, rank: int, map_location=None, verify: bool = True,
             weights_only: bool = True, mmap=None, into=None):
        """A pool version, read by the pool's reader (into: not used; the caller copies)."""
        name = info.entry_for(rank).name
        model, counter = name.rsplit("@", 1)
        pool = self._open(create=False)
        for v in pool.versions(model) if pool is not None else []:
            if v.counter == int(counter):
                return read_version(self.pool, v, map_location, verify, weights_only)
        raise CorruptCheckpointError(f"{self.root}#{name} is no longer in the pool")
