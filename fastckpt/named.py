"""NamedCheckpoints: checkpoints named by a path or URL, over any store — what the plugins build on.

Each `save(state, path)` is one asynchronous checkpoint at exactly `path`: a file written by
the path store (a local path, a per-rank directory, a URL), or with `pool=...` a model of a
persistent-memory pool named by the path (the pmem store). This object keeps what is in flight
by path (a load of a path in flight waits for it), loads whatever a path holds (a pool model,
a URL with its commit marker, a per-rank directory, a plain file), removes a path now or once
it has landed and a newer checkpoint is committed (`remove`), reports sizes, and reopens its
Checkpointer with new settings (`reconfigure`). Frameworks decide the paths, retention and
ranks, so `root`, `store`, `keep`, `distributed` and `model` are never settings here.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from typing import Any, Callable, Optional

import torch

from .commit import record as commit
from .checkpointer import Checkpointer
from .config import CheckpointerConfig
from .format import load_file
from .pending import Pending
from .save_load import load as load_single
from .store import path_store
from .commit.record import file_size
from .pmem.pointer import is_pool_pointer, write_pointer

DECIDED_BY_CALLER = ("root", "store", "keep", "distributed", "model")  # paths, retention, ranks


def checkpointer_kwargs(settings: dict, pool: Optional[str]) -> dict:
    """Checkpointer keyword arguments for checkpoints named by path: the path store, or the
    pool's models named by path."""
    where = dict(root=os.fspath(pool), store="pmem", model=None) if pool is not None else dict(store="path")
    return dict(settings, **where)


def key_of(path: str) -> str:
    """The one spelling of a path that saves, loads and removals are matched by."""
    return path if path_store.is_remote(path) else path_store.local_path(path)


class NamedCheckpoints:
    """Checkpoints saved, loaded and removed by path.

    Args:
        settings: Checkpointer settings (fastckpt.config.CheckpointerConfig's fields but
            DECIDED_BY_CALLER); checked here, before anything is opened.
        pool: a persistent-memory pool; paths then name its models instead of files.
        distributed: as the Checkpointer's (None: every rank saves its part of each path).
        pool_pointers: with a pool, a path is read from the pool only where it holds the
            small pointer file `leave_pointer` writes (DeepSpeed, whose own globbing needs
            files there); otherwise every path is read from the pool.

    `free`: how a removed file's blocks are freed, `free(fn)`; None (the default) runs fn at
    once. TrainingSaves sets it to free off the training thread while a run is on.
    """

    def __init__(self, settings: dict, pool: Optional[str] = None, distributed: Optional[bool] = False,
                 pool_pointers: bool = False):
        self.pool = os.fspath(pool) if pool is not None else None
        self.settings = dict(settings)
        CheckpointerConfig(**checkpointer_kwargs(self.settings, self.pool)).validate()
        self.distributed = distributed
        self.pool_pointers = pool_pointers
        self.free: Optional[Callable[[Callable[[], None]], Any]] = None
        self._ck: Optional[Checkpointer] = None
        self._by_path: dict[str, Pending] = {}
        self._order: dict[str, int] = {}  # path -> when it was last saved (counters restart on reconfigure)
        self._saves = 0
        self._deferred: dict[str, tuple[str, int]] = {}  # removals waiting for a newer commit

    @property
    def checkpointer(self) -> Checkpointer:
        """The Checkpointer behind every path, opened at first use (and after close())."""
        if self._ck is None:
            self._ck = Checkpointer(distributed=self.distributed, **checkpointer_kwargs(self.settings, self.pool))
        return self._ck

    @property
    def opened(self) -> bool:
        return self._ck is not None

    # -- saving ----------------------------------------------------------
    def save(self, state, path: str, step: int, held: bool = False, watch=None) -> Pending:
        """One asynchronous checkpoint at exactly `path`; a pending removal of it is cancelled,
        the other deferred removals that may go now are done."""
        path = os.fspath(path)
        key = key_of(path)
        self._deferred.pop(key, None)  # saving again under a name cancels its pending removal
        self.remove_deferred()
        if self.pool is None:
            _make_parent(path)
        pending = self.checkpointer.save(state, step=step, path=path, held=held, watch=watch)
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
        write_pointer(path, self.pool, self.checkpointer.store.name_of(path))

    # -- loading ---------------------------------------------------------
    def load(self, path: str, map_location=None, verify: bool = True, weights_only: bool = True,
             mmap: Optional[bool] = None):
        """What `path` holds, once a save of it in flight here has landed."""
        path = os.fspath(path)
        self.settle(path)
        if self.pool is not None and (not self.pool_pointers or is_pool_pointer(path)):
            rank = torch.distributed.get_rank() if self.distributed is None and torch.distributed.is_initialized() else 0
            return self.checkpointer.store.load_named(path, rank, map_location, verify, weights_only)
        if path_store.is_remote(path):
            return _load_url(path, map_location, verify, weights_only)
        local = path_store.local_path(path)
        if os.path.isdir(local):  # per-rank checkpoint directory
            info = commit.read(local)
            rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
            return load_file(info.file_for(rank), map_location, verify, weights_only,
                             expect_crc=info.entry_for(rank).crc32 if verify else None)
        if not os.path.exists(local):
            raise FileNotFoundError(f"Checkpoint file not found: {path}")  # Lightning's own words
        return load_single(local, map_location=map_location, verify=verify, weights_only=weights_only, mmap=mmap)

    def size(self, path: str) -> Optional[int]:
        """Bytes saved at path: the file, or the pool's current version of it (None: nothing)."""
        return self.checkpointer.store.named_size(path) if self.pool is not None else file_size(path)

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
        if self.pool is not None:
            self.checkpointer.store.drop_named(path)
        if self.pool is None or os.path.lexists(path_store.local_path(path)) or path_store.is_remote(path):
            path_store.remove(path, later=self.free)

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

    def wait(self) -> None:
        """Until every save in flight has landed; a failed one is raised or warned about as
        the on_error setting says."""
        if self._ck is not None:
            self._ck.wait()

    def reconfigure(self, **changes) -> None:
        """New settings (the tuner's concurrency / writers): checked first, then what is in flight
        lands and the next use opens the Checkpointer with them."""
        new = dict(self.settings, **{k: v for k, v in changes.items() if v is not None})
        CheckpointerConfig(**checkpointer_kwargs(new, self.pool)).validate()  # before anything changes
        ck, self._ck = self._ck, None
        if ck is not None:
            ck.close()
        self.settings = new  # what was saved stays tracked: its removals still wait for a newer commit

    def close(self) -> None:
        """Everything in flight lands (its first error raised); the deferred removals whose
        newer checkpoint is committed are done; only paths whose removal still waits stay
        tracked. The next save opens a new Checkpointer."""
        ck, self._ck = self._ck, None
        try:
            if ck is not None:
                ck.close()
        finally:
            self.remove_deferred()
            self._keep_tracking(lambda k, p: k in self._deferred)


def _load_url(url: str, map_location, verify: bool, weights_only: bool):
    tmp = tempfile.mkdtemp(prefix="fastckpt-download-")
    try:
        local, crc = path_store.download(url, tmp)
        if crc is None:
            warnings.warn(f"fastckpt: {url} has no fastckpt commit record ({url}{path_store.MARKER_SUFFIX}): "
                          "it was not uploaded by fastckpt (or its upload was cut short after the data); "
                          "loaded as Lightning would, checked only by its own CRCs", stacklevel=4)
        return load_file(local, map_location, verify, weights_only, expect_crc=crc, mmap=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _make_parent(path: str) -> None:
    if path_store.is_remote(path):
        path_store.filesystem(path).makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path_store.local_path(path)), exist_ok=True)
