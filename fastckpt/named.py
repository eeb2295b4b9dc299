"""NamedCheckpoints: checkpoints named by a path or URL — what the plugins build on.

`NamedCheckpoints(config)` takes settings placed by fastckpt.settings.placed_by_path where they
entered (`NamedCheckpoints.by_path(settings, pool=, ...)` places a mapping). Each
`save(state, path)` is one asynchronous checkpoint at exactly `path`: a file written by the path
store (a local path, a per-rank directory, a URL; a memory tier in front when the settings name
one), or with a pool a model of a persistent-memory pool named by the path (the pmem store).
This object keeps what is in flight by path (a load of a path in flight waits for it), loads
whatever a path holds (a pool model, a URL with its commit marker, a per-rank directory, a plain
file), removes a path now or once it has landed and a newer checkpoint is committed (`remove`),
reports sizes, and reopens its Checkpointer with new settings (`reconfigure`). Frameworks decide the paths, retention and
ranks, so fastckpt.settings.PLACEMENT's fields are never settings here.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Optional

import torch

from .checkpointer import Checkpointer
from .settings import CheckpointerConfig, placed_by_path, refuse_placement
from .pending import Pending
from .store import ByPath, open_store, path_store


def key_of(path: str) -> str:
    """The one spelling of a path that saves, loads and removals are matched by."""
    return path if path_store.is_remote(path) else path_store.local_path(path)


class NamedCheckpoints:
    """Checkpoints saved, loaded and removed by path.

    Args:
        config: the settings, placed for checkpoints named by path (fastckpt.settings.placed_by_path,
            where the settings entered: the path store, with a memory tier in front when it names
            one, or a persistent-memory pool whose models the paths name; its ranks). `by_path`
            places settings not yet placed: a mapping of CheckpointerConfig's fields but
            PLACEMENT's others, or a plugin's CheckpointerConfig, with `pool` and `distributed`.
            Their `tiers` (e.g. ["/dev/shm/run7"]; `tier_keep`: how many it keeps, [1] by default)
            put a memory tier in front of the paths: each save commits there first and is
            persisted to its path from that copy; a load reads the memory copy of the file at a
            path when there is one (fastckpt.store.named_tiers).
        pool_pointers: with a pool, a path is read from the pool only where it holds the
            small pointer file `leave_pointer` writes (DeepSpeed, whose own globbing needs
            files there); otherwise every path is read from the pool.

    `free`: how a removed file's blocks are freed, `free(fn)`; None (the default) runs fn at
    once. fastckpt.session's TrainingSession sets it to free off the training thread while a run is on.
    """

    def __init__(self, config: CheckpointerConfig, pool_pointers: bool = False):
        # the one object every Checkpointer here opens from, placed where the settings entered (a
        # plugin's front door: settings.placed_by_path, or by_path below); its pool and ranks are its own
        if not isinstance(config, CheckpointerConfig):
            raise TypeError("NamedCheckpoints takes settings placed by fastckpt.settings.placed_by_path; "
                            "NamedCheckpoints.by_path(...) places a mapping of settings")
        self.config = config
        self.pool = config.root if config.store == "pmem" else None
        self.distributed = config.distributed
        self.pool_pointers = pool_pointers
        self.free: Optional[Callable[[Callable[[], None]], Any]] = None
        self._ck: Optional[Checkpointer] = None
        self._reader: Optional[ByPath] = None  # a store opened to read while no Checkpointer is
        self._by_path: dict[str, Pending] = {}
        self._order: dict[str, int] = {}  # path -> when it was last saved (counters restart on reconfigure)
        self._saves = 0
        self._deferred: dict[str, tuple[str, int]] = {}  # removals waiting for a newer commit
        self.closed_stats: list[dict] = []  # the stats of every Checkpointer closed here, in turn
        self.reads: list = []  # with a memory tier: where each load came from (fastckpt.store.named_tiers.NamedRead)
        # False: a save does not raise a failed earlier one; the caller does (take_errors), at a call every
        # process of its job makes (Lightning's rank 0 saving alone: lightning_fastckpt.watch)
        self.raise_at_save = True

    @classmethod
    def by_path(cls, settings: Any, pool: Optional[str] = None, distributed: Optional[bool] = False,
                pool_pointers: bool = False) -> "NamedCheckpoints":
        """From settings not yet placed (a mapping, or a CheckpointerConfig): placed here by
        settings.placed_by_path with this pool and ranks."""
        return cls(placed_by_path(settings, pool=os.fspath(pool) if pool is not None else None,
                                  distributed=distributed), pool_pointers)

    @property
    def settings(self) -> dict:
        """The settings a caller may change (reconfigure): every field but PLACEMENT's."""
        return self.config.writing()

    @property
    def checkpointer(self) -> Checkpointer:
        """The Checkpointer behind every path, opened at first use (and after close())."""
        if self._ck is None:
            self._close_reader()  # one store of the place open at a time
            self._ck = Checkpointer.from_config(self.config)
            self._ck.store.pointers = self.pool_pointers
            self._ck.raise_at_save = self.raise_at_save
        return self._ck

    def timing_stats(self) -> list[dict]:
        """The stats of every Checkpointer opened here, the open one last (fastckpt.timings.steady
        takes them): each run of a plugin opens its own."""
        return self.closed_stats + ([self._ck.stats] if self._ck is not None else [])

    @property
    def opened(self) -> bool:
        return self._ck is not None

    @property
    def _store(self) -> ByPath:
        """The store behind every path: the open Checkpointer's, or else one opened only to read,
        size and remove by path (reading opens no Checkpointer)."""
        if self._ck is not None:
            return self._ck.store
        if self._reader is None:
            dist = torch.distributed
            spread = self.distributed is not False and dist.is_initialized()
            rank, world = (dist.get_rank(), dist.get_world_size()) if spread else (0, 1)
            self._reader = open_store(self.config, rank, world)
            self._reader.pointers = self.pool_pointers
        return self._reader

    def _close_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()

    # -- saving ----------------------------------------------------------
    def save(self, state, path: str, step: int, held: bool = False, watch=None,
             strategy: Optional[str] = None) -> Pending:
        """One asynchronous checkpoint at exactly `path` (strategy: this save's, Checkpointer.save's);
        a pending removal of it is cancelled, the other deferred removals that may go now are done."""
        path = os.fspath(path)
        key = key_of(path)
        self._deferred.pop(key, None)  # saving again under a name cancels its pending removal
        self.remove_deferred()
        self.checkpointer.store.prepare_path(path)
        pending = self.checkpointer.save(state, step=step, path=path, held=held, watch=watch, strategy=strategy)
        self._saves += 1
        self._by_path[key], self._order[key] = pending, self._saves
        return pending

    def pending(self, path: str) -> Optional[Pending]:
        """The latest save of this path, if it was made here (landed or not)."""
        return self._by_path.get(key_of(os.fspath(path)))

    def tracked(self) -> dict[str, Pending]:
        """Every path saved here and still tracked, with its latest save."""
        return dict(self._by_path)

    def settle(self, path: str) -> None:
        """Waits for the save in flight at this path, if any; raises its error."""
        pending = self.pending(path)
        if pending is not None and not pending.done():
            pending.release_all()
            pending.wait()

    def forget_landed(self) -> None:
        """Stops tracking saves that have landed (a long run keeps only what is in flight)."""
        self._keep_tracking(lambda k, p: not p.done() or k in self._deferred)

    def _keep_tracking(self, keep: Callable[[str, Pending], bool]) -> None:
        self._by_path = {k: p for k, p in self._by_path.items() if keep(k, p)}
        self._order = {k: n for k, n in self._order.items() if k in self._by_path}

    def leave_pointer(self, path: str) -> None:
        """At a pool-backed path whose version is current: a small file naming the pool and model."""
        self._store.mark_durable(path)

    # -- loading ---------------------------------------------------------
    def load(self, path: str, map_location=None, verify: bool = True, weights_only: bool = True,
             mmap: Optional[bool] = None):
        """What `path` holds, once a save of it in flight here has landed."""
        path = os.fspath(path)
        self.settle(path)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        store = self._store
        reads = getattr(store, "reads", None)
        before = len(reads) if reads is not None else 0
        try:
            return store.load_path(path, rank, map_location, verify, weights_only, mmap)
        finally:
            if reads is not None:
                self.reads += reads[before:]

    def size(self, path: str) -> Optional[int]:
        """Bytes saved at path: the file, or the pool's current version of it (None: nothing)."""
        return self._store.size_of(path)

    # -- removing --------------------------------------------------------
    def remove(self, path: str) -> None:
        """Deletes `path` now if it was not saved here, or if it has landed and a newer checkpoint
        is committed; otherwise as soon as both hold (checked by `remove_deferred`). Never blocks."""
        path = os.fspath(path)
        key = key_of(path)
        pending = self._by_path.get(key)
        if pending is None:  # not written here (another IO, an earlier run): deleted now
            self._deferred.pop(key, None)
            self._remove_now(path)
            return
        self._deferred[key] = (path, self._order[key])
        self.remove_deferred()

    def remove_deferred(self) -> None:
        """Each deferred removal whose path has landed and has a newer committed checkpoint."""
        for key, (path, base) in list(self._deferred.items()):
            mine = self._by_path.get(key)
            if mine is not None and not mine.done():
                continue  # still in flight: deleting now would let its rename bring it back
            if self._committed_newer(base, exclude=key):
                del self._deferred[key]
                self._remove_now(path)
                self._by_path.pop(key, None)
                self._order.pop(key, None)

    def _committed_newer(self, base: int, exclude: str) -> bool:
        return any(k != exclude and k not in self._deferred and self._order[k] > base and p.done()
                   and p.error is None and not p.skipped for k, p in self._by_path.items())

    def _remove_now(self, path: str) -> None:
        self._store.remove_path(path, later=self.free)

    # -- the Checkpointer's life -----------------------------------------
    def gate(self) -> None:
        """Before an optimizer update: every snapshot in flight has copied what it overwrites."""
        if self._ck is not None:
            self._ck.gate()

    def reserve(self, nbytes: int, device: str = "cpu") -> None:
        self.checkpointer.reserve(nbytes, device)

    def in_flight(self) -> list[Pending]:
        return self._ck.in_flight() if self._ck is not None else []

    def progress(self) -> int:
        """What the writes of the open Checkpointer moved so far (0 when none is open); a wait
        for its saves that sees this grow is not stalled."""
        ck = self._ck  # read once: close() may drop it meanwhile (tag commits poll this)
        return ck.progress() if ck is not None else 0

    def take_errors(self) -> list[BaseException]:
        """The saves that failed and that nobody observed yet, handed over (each once): what the open
        Checkpointer would raise at its next save (see raise_at_save)."""
        return self._ck.take_errors() if self._ck is not None else []

    def wait(self) -> None:
        """Until every save in flight has landed; a failed one is raised or warned about as
        the on_error setting says."""
        if self._ck is not None:
            self._ck.wait()

    def reconfigure(self, **changes) -> None:
        """New settings (the tuner's concurrency / writers): checked first, then what is in flight
        lands and the next use opens the Checkpointer with them."""
        changes = {k: v for k, v in changes.items() if v is not None}
        refuse_placement(changes, given=())
        new = dataclasses.replace(self.config, **changes)  # checked as made, first
        ck, self._ck = self._ck, None
        if ck is not None:
            ck.close()
            self.closed_stats.append(ck.stats)
        self._close_reader()
        self.config = new  # what was saved stays tracked: its removals still wait for a newer commit

    def close(self) -> None:
        """Everything in flight lands (its first error raised); the deferred removals whose
        newer checkpoint is committed are done; only paths whose removal still waits stay
        tracked. The next save opens a new Checkpointer."""
        ck, self._ck = self._ck, None
        try:
            if ck is not None:
                ck.close()
                self.closed_stats.append(ck.stats)
        finally:
            try:
                self.remove_deferred()
            finally:
                self._close_reader()
            self._keep_tracking(lambda k, p: k in self._deferred)
