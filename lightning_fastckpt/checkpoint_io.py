"""FastCheckpointIO: Lightning's (and Fabric's) CheckpointIO over fastckpt's asynchronous Checkpointer.

Owns the mapping from Lightning's calls to fastckpt: each `save_checkpoint(ckpt, path)`
is one checkpoint written at exactly `path` (an ordinary `.ckpt` file `torch.load`
reads) by the `path` store; it returns once the snapshot is issued. Consistency:
tensors only `optimizer.step()` writes are copied in the background and the update
waits for them (fastckpt.write.gate) — once the run has shown that nothing else writes
them between a save and the next step (fastckpt.write.watch; until then, and after any
such write, they are copied before save returns); every other tensor is copied at once.
Outside a training run a save is durable when it returns. `load_checkpoint` of an
in-flight path waits for it; `remove_checkpoint` never blocks: a path still in flight, or
whose removal would leave no valid checkpoint, is deleted once it has landed and a newer
one is committed. With `pool=...` the paths name models of a persistent-memory pool instead
of files (fastckpt's pmem store): saved, loaded and removed by path the same way. `teardown` waits for
everything and raises the first write error; one nobody saw is raised by the next save.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from typing_extensions import override

import fastckpt
from fastckpt import commit
from fastckpt.checkpointer import Checkpointer
from fastckpt.config import DEFAULTS as D
from fastckpt.config import CheckpointerConfig
from fastckpt.errors import ConfigError
from fastckpt.format import load_file
from fastckpt.write.layerwise import HeldSnapshots
from fastckpt.write.gate import StepGate
from fastckpt.store import path_store


IGNORED_KEYS = ("root", "store", "keep", "distributed", "model")  # Lightning decides paths and retention
CHECKPOINTER_KEYS = ("strategy", "concurrency", "writers", "chunk_mb", "staging_mb", "format", "policy",
                     "direct_io", "verify", "on_error", "stall_timeout_s", "pool_mb", "persist")  # settings passed on as they are


class FastCheckpointIO(CheckpointIO):
    """Asynchronous, crash-safe checkpoints for `Trainer(plugins=[FastCheckpointIO(...)])`.

    Args:
        strategy: "c" (copy into staging, default), "g" (full second copy first) or "d" (direct).
        concurrency: checkpoints in flight at once (PCcheck's N).
        writers: writer threads per checkpoint in flight.
        chunk_mb: staging chunk size.
        staging_mb: bound on staging memory (default: concurrency x checkpoint size, <= RAM/2).
        format: "torch" (an ordinary .ckpt) or "safetensors".
        policy: "wait" (a save waits for a free slot) or "skip" (it is dropped with a warning).
        verify: check every CRC on load.
        per_rank: every rank saves (sharded strategies): the path becomes a directory with one
            file per rank and a COMMIT record written once all ranks are durable.
        layerwise: hold each snapshot until its DDP gradient bucket is final (needs the
            `LayerwiseCheckpointing` callback, which sets this).
        pool: a persistent-memory pool (/dev/daxN.M, a file on an fsdax mount or on /dev/shm):
            each checkpoint path becomes a model of the pool instead of a file.
        pool_mb, persist: size of a new pool, and "auto" | "fence" | "msync" (see the README).
        on_error: "raise" (a failed checkpoint stops training at the next save or at teardown)
            or "warn" (it is logged and warned about, the previous checkpoint stays, training goes on).
        stall_timeout_s: a copy or write that makes no progress for this long fails its checkpoint
            (a CheckpointWriteError naming what it waited for) instead of hanging training.
    """

    def __init__(self, strategy: str = D.strategy, concurrency: int = D.concurrency, writers: int = D.writers,
                 chunk_mb: int = D.chunk_mb, staging_mb: Optional[int] = D.staging_mb, format: str = D.format,
                 policy: str = D.policy, direct_io: bool = D.direct_io, verify: bool = D.verify,
                 per_rank: bool = False, layerwise: bool = False, pool: Optional[str] = None,
                 pool_mb: Optional[int] = D.pool_mb, persist: str = D.persist, on_error: str = D.on_error,
                 stall_timeout_s: float = D.stall_timeout_s):
        self._settings = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        self.pool = os.fspath(pool) if pool is not None else None
        CheckpointerConfig(**self._checkpointer_kwargs()).validate()
        self.verify, self.per_rank, self.layerwise = verify, per_rank, layerwise
        self._ck: Optional[Checkpointer] = None
        self._by_path: dict[str, fastckpt.Pending] = {}
        self._deferred: dict[str, tuple[str, int]] = {}  # removals waiting for a newer commit
        self._reaper: Optional[ThreadPoolExecutor] = None
        self.stats = {"saves": 0}
        self._active = False  # between the first save or optimizer step of a run and its teardown
        self._wrapped = False  # called from another IO's thread (AsyncCheckpointIO): act synchronously
        self.gate = StepGate(self._gate)
        self.gate.install()
        self.held = HeldSnapshots(self.gate)

    def _checkpointer_kwargs(self, settings: Optional[dict] = None) -> dict:
        """What the Checkpointer is opened with, derived from the plugin's settings (or the
        given ones): one source for both, so reconfigure() cannot leave them apart."""
        s = self._settings if settings is None else settings
        kwargs = {k: s[k] for k in CHECKPOINTER_KEYS}
        if s["pool"] is not None:
            kwargs.update(root=os.fspath(s["pool"]), store="pmem", model=None)
        else:
            kwargs.update(store="path")
        return kwargs

    def __repr__(self) -> str:
        changed = {k: v for k, v in self._settings.items() if getattr(D, k, None) != v and v not in (None, False)}
        return f"FastCheckpointIO({', '.join(f'{k}={v!r}' for k, v in changed.items())})"

    def __getstate__(self) -> dict:
        """Pickled (ddp_spawn sends the trainer to its processes, torch.save(trainer)) as its
        settings: the copy is a fresh plugin; saves in flight stay with the original."""
        return dict(self._settings)

    def __setstate__(self, settings: dict) -> None:
        self.__init__(**settings)

    @classmethod
    def from_config(cls, cfg) -> "FastCheckpointIO":
        """From a Hydra/OmegaConf config or dict with fastckpt's field names (root/store/keep ignored)."""
        from fastckpt.config import flatten
        flat = {k: v for k, v in flatten(cfg).items() if k not in IGNORED_KEYS}
        extra = {k: flat.pop(k) for k in ("per_rank", "layerwise") if k in flat}
        flat.pop("commit_timeout_s", None)
        try:
            return cls(**flat, **extra)
        except TypeError as e:
            raise ConfigError(f"unknown FastCheckpointIO setting: {e}") from None

    # -- saving ----------------------------------------------------------
    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None:
            raise TypeError("FastCheckpointIO.save_checkpoint does not take storage_options; "
                            "set its options in the constructor")
        self.gate.install()  # again after a teardown: this plugin is in use in a new run
        path = os.fspath(path)
        key = _key(path)
        self._deferred.pop(key, None)  # saving again under a name cancels its pending removal
        self._remove_deferred()
        running = self.gate.steps_seen > 0
        view = self.gate.snapshot_view(checkpoint)
        if self.pool is None:
            _make_parent(path)
        held = self.layerwise and running and not view.copy_now
        pending = self._checkpointer().save(view.state, step=int(checkpoint.get("global_step", 0) or 0),
                                            path=path, held=held, watch=view.watch)
        self._by_path[key] = pending
        self.stats["saves"] += 1
        self._active = self._active or running
        if held and not pending.skipped:
            self.held.hold(pending, view.owned)
        if not self._wrapped and threading.current_thread() is not threading.main_thread():
            self._wrapped = True
            warnings.warn("FastCheckpointIO is called off the training thread (wrapped by "
                          "AsyncCheckpointIO?): it already saves asynchronously, so it now makes each "
                          "save durable before returning; the wrapper only adds a copy, and its "
                          "removals of older top-k files can reach this plugin before their saves do.",
                          stacklevel=2)
        if not running or self._wrapped:
            # trainer.save_checkpoint() outside fit, or a caller already off the training thread
            # (AsyncCheckpointIO wrapping this plugin: its teardown waits for its own thread and
            # never reaches ours): durable when it returns, its commit thread gone
            pending.release_all()
            self._checkpointer().wait()
            pending.wait()
            self._remove_deferred()  # removals that waited for a newer checkpoint: it is here
        elif view.copy_now:  # until the run has shown only the optimizer writes these tensors
            pending.release_all()
            pending.wait_copied()

    def _checkpointer(self) -> Checkpointer:
        if self._ck is None:
            self._ck = Checkpointer(distributed=None if self.per_rank else False, **self._checkpointer_kwargs())
        return self._ck

    def _gate(self) -> None:
        """Before an optimizer update: every snapshot in flight has copied what the update overwrites."""
        self._active = True
        self.held.clear()
        if self._ck is not None:
            self._ck.gate()
        if self.gate.steps_seen == 2:  # optimizer state exists now: fault staging in early
            self._checkpointer().reserve(self.gate.owned_bytes(), self.gate.owned_device())

    # -- loading ---------------------------------------------------------
    @override
    def load_checkpoint(self, path, map_location: Optional[Any] = None,
                        weights_only: Optional[bool] = None) -> dict[str, Any]:
        self.gate.install()  # a resume starts a run
        path = os.fspath(path)
        self._settle(_key(path))
        weights_only = True if weights_only is None else weights_only
        if self.pool is not None:
            rank = torch.distributed.get_rank() if self.per_rank and torch.distributed.is_initialized() else 0
            return self._checkpointer().store.load_named(path, rank, map_location, self.verify, weights_only)
        if path_store.is_remote(path):
            tmp = tempfile.mkdtemp(prefix="fastckpt-download-")
            try:
                local, crc = path_store.download(path, tmp)
                if crc is None:
                    warnings.warn(f"fastckpt: {path} has no fastckpt commit record ({path}{path_store.MARKER_SUFFIX}): "
                                  "it was not uploaded by fastckpt (or its upload was cut short after the data); "
                                  "loaded as Lightning would, checked only by its own CRCs", stacklevel=2)
                return load_file(local, map_location, self.verify, weights_only, expect_crc=crc, mmap=False)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        local = path_store.local_path(path)
        if os.path.isdir(local):  # per-rank checkpoint directory
            info = commit.read(local)
            rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
            return load_file(info.file_for(rank), map_location, self.verify, weights_only,
                             expect_crc=info.entry_for(rank).crc32 if self.verify else None)
        if not os.path.exists(local):
            raise FileNotFoundError(f"Checkpoint file not found: {path}")  # Lightning's own words
        return fastckpt.load(local, map_location=map_location, verify=self.verify, weights_only=weights_only)

    # -- removing --------------------------------------------------------
    @override
    def remove_checkpoint(self, path) -> None:
        """Deletes `path` now if a newer checkpoint is committed; otherwise, or while `path` is
        still being written, as soon as both hold (at a later save or at teardown). Never
        blocks: ModelCheckpoint removes the previous file right after issuing the next save,
        so waiting here would make every save wait for the one before it."""
        path = os.fspath(path)
        key = _key(path)
        pending = self._by_path.get(key)
        if pending is None:  # not written by this plugin (another IO, an earlier run): as Lightning does
            self._deferred.pop(key, None)
            self._remove_now(path)
            return
        self._deferred[key] = (path, pending.counter)
        self._remove_deferred()

    def _remove_now(self, path: str) -> None:
        if self.pool is not None:
            self._checkpointer().store.drop_named(path)
        if self.pool is None or os.path.lexists(path_store.local_path(path)) or path_store.is_remote(path):
            path_store.remove(path, later=self._reap)

    def _committed_newer(self, base: int, exclude: str) -> bool:
        return any(k != exclude and k not in self._deferred and p.counter > base and p.done()
                   and p.error is None and not p.skipped for k, p in self._by_path.items())

    def _remove_deferred(self) -> None:
        for key, (path, base) in list(self._deferred.items()):
            mine = self._by_path.get(key)
            if mine is not None and not mine.done():
                continue  # still in flight: deleting now would let its rename bring it back
            if self._committed_newer(base, exclude=key):
                del self._deferred[key]
                self._remove_now(path)
                self._by_path.pop(key, None)

    def _reap(self, free) -> None:
        """Frees a removed file's blocks off the training thread during a run (joined at
        teardown); outside a run, or wrapped by another IO whose teardown never reaches this
        one, at once: no thread of this plugin outlives its run."""
        if not self._active or self._wrapped:
            free()
            return
        if self._reaper is None:
            self._reaper = ThreadPoolExecutor(1, thread_name_prefix="fastckpt-remove")
        self._reaper.submit(free)

    def _settle(self, key: str) -> None:
        """Waits for the checkpoint in flight at this path, if any; raises its error."""
        pending = self._by_path.get(key)
        if pending is not None and not pending.done():
            pending.release_all()
            pending.wait()

    def reconfigure(self, concurrency: Optional[int] = None, writers: Optional[int] = None) -> None:
        """New concurrency / writers (the tuner's N*, p*): what is in flight lands first, and the
        next save opens the Checkpointer with them."""
        new = dict(self._settings)
        new.update({k: v for k, v in (("concurrency", concurrency), ("writers", writers)) if v is not None})
        CheckpointerConfig(**self._checkpointer_kwargs(new)).validate()  # before anything changes
        ck, self._ck = self._ck, None
        if ck is not None:
            ck.close()
        self._settings = new

    def in_flight(self) -> int:
        """Checkpoints saved and not yet landed."""
        return len(self._ck.in_flight()) if self._ck is not None else 0

    def wait(self) -> None:
        """Blocks until every checkpoint in flight has landed; a failed one is raised or warned
        about as on_error says."""
        if self._ck is not None:
            self._ck.wait()

    # -- teardown --------------------------------------------------------
    @override
    def teardown(self) -> None:
        """Waits for every checkpoint in flight and raises the first write error (on_error="raise")."""
        self.held.clear()
        self.gate.remove()  # no optimizer step of anyone reaches this plugin any more
        self.gate.steps_seen = 0
        self.gate.trust.reset()
        self._active = False
        ck, self._ck = self._ck, None
        try:
            if ck is not None:
                ck.close()
        finally:
            self._remove_deferred()
            self._by_path = {k: p for k, p in self._by_path.items() if k in self._deferred}
            reaper, self._reaper = self._reaper, None
            if reaper is not None:
                reaper.shutdown(wait=True)



def _key(path: str) -> str:
    return path if path_store.is_remote(path) else path_store.local_path(path)


def _make_parent(path: str) -> None:
    if path_store.is_remote(path):
        path_store.filesystem(path).makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path_store.local_path(path)), exist_ok=True)
