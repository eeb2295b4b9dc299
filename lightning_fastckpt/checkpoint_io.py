"""FastCheckpointIO: Lightning's (and Fabric's) CheckpointIO over fastckpt's asynchronous Checkpointer.

Owns the mapping from Lightning's calls to fastckpt: each `save_checkpoint(ckpt, path)`
is one checkpoint written at exactly `path` (an ordinary `.ckpt` file `torch.load`
reads) by the `path` store; it returns once the snapshot is issued, the optimizer update
waiting for the copies it would overwrite (fastckpt.training_saves). Outside a training
run, or called off the training thread, a save is durable when it returns.
`load_checkpoint` of an in-flight path waits for it; `remove_checkpoint` never blocks: a
path still in flight, or whose removal would leave no valid checkpoint, is deleted once it
has landed and a newer one is committed. With `pool=...` the paths name models of a
persistent-memory pool instead of files: saved, loaded and removed by path the same way
(all of it fastckpt.named.NamedCheckpoints). `teardown` waits for everything and raises
the first write error; one nobody saw is raised by the next save.
"""
from __future__ import annotations

import os
import threading
import warnings
from typing import Any, Optional

from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from typing_extensions import override

from fastckpt.settings import DEFAULTS as D
from fastckpt.settings import flatten
from fastckpt.errors import ConfigError
from fastckpt.named import DECIDED_BY_CALLER, NamedCheckpoints
from fastckpt.training_saves import TrainingSaves

from .bypass_warning import is_dcp_folder, say_bypassed

CHECKPOINTER_KEYS = ("strategy", "concurrency", "writers", "chunk_mb", "staging_mb", "format", "policy",
                     "direct_io", "verify", "on_error", "stall_timeout_s", "pool_mb", "persist")  # settings passed on as they are


class FastCheckpointIO(CheckpointIO):
    """Asynchronous, crash-safe checkpoints for `Trainer(plugins=[FastCheckpointIO(...)])`.

    Args:
        strategy: "c" (copy into staging, default), "g" (full second copy first) or "d" (direct).
        concurrency: checkpoints in flight at once (PCcheck's N).
        writers: writer threads per unit of concurrency: one shared pool of writers x concurrency
            threads drains every checkpoint in flight (one alone may use them all).
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
        pool_mb, persist: size of a new pool, and "auto" | "fence" | "msync" (docs/pmem.md).
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
        self.verify, self.per_rank, self.layerwise = verify, per_rank, layerwise
        self.named = NamedCheckpoints({k: self._settings[k] for k in CHECKPOINTER_KEYS}, pool=self.pool,
                                      distributed=None if per_rank else False)
        self.stats = {"saves": 0}
        self.saves = TrainingSaves(self.named, self.named.gate)

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
        flat = {k: v for k, v in flatten(cfg).items() if k not in DECIDED_BY_CALLER}
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
        self.saves.gate.install()  # again after a teardown: this plugin is in use in a new run
        running = self.saves.running
        pending = self.saves.save(checkpoint, os.fspath(path), int(checkpoint.get("global_step", 0) or 0),
                                  held=self.layerwise)
        self.stats["saves"] += 1
        if not self.saves.synchronous and threading.current_thread() is not threading.main_thread():
            self.saves.synchronous = True
            warnings.warn("FastCheckpointIO is called off the training thread (wrapped by "
                          "AsyncCheckpointIO?): it already saves asynchronously, so it now makes each "
                          "save durable before returning and closes its threads after each; the "
                          "wrapper only adds a copy, and its removals of older top-k files can reach "
                          "this plugin before their saves do.", stacklevel=2)
        if not running or self.saves.synchronous:
            # trainer.save_checkpoint() outside fit, or a caller already off the training thread
            # (AsyncCheckpointIO wrapping this plugin: its teardown waits for its own thread and
            # never reaches ours): no teardown of ours follows, so the save is durable when it
            # returns and nothing of it outlives it — its Checkpointer is closed (threads, staging;
            # the next save opens one) and the removals that waited for a newer checkpoint are done
            pending.release_all()
            self.saves.reserve_ahead = running  # armed again by this save: see TrainingSaves
            try:
                self.named.wait()
                pending.wait()
            finally:
                self.named.close()

    # -- loading ---------------------------------------------------------
    @override
    def load_checkpoint(self, path, map_location: Optional[Any] = None,
                        weights_only: Optional[bool] = None) -> dict[str, Any]:
        self.saves.gate.install()  # a resume starts a run
        self.saves.reserve_ahead = True
        return self.named.load(os.fspath(path), map_location, self.verify, True if weights_only is None else weights_only)

    # -- removing --------------------------------------------------------
    @override
    def remove_checkpoint(self, path) -> None:
        """Deletes `path` now if a newer checkpoint is committed; otherwise, or while `path` is
        still being written, as soon as both hold (at a later save or at teardown). Never
        blocks: ModelCheckpoint removes the previous file right after issuing the next save,
        so waiting here would make every save wait for the one before it."""
        if self.named.pending(os.fspath(path)) is None and is_dcp_folder(os.fspath(path)):
            say_bypassed(f"{os.fspath(path)} was saved by the strategy itself")
        self.named.remove(os.fspath(path))

    def reconfigure(self, concurrency: Optional[int] = None, writers: Optional[int] = None) -> None:
        """New concurrency / writers (the tuner's N*, p*): what is in flight lands first, and the
        next save opens the Checkpointer with them."""
        self.named.reconfigure(concurrency=concurrency, writers=writers)
        self._settings.update(concurrency=self.named.settings["concurrency"], writers=self.named.settings["writers"])

    def in_flight(self) -> int:
        """Checkpoints saved and not yet landed."""
        return len(self.named.in_flight())

    def wait(self) -> None:
        """Blocks until every checkpoint in flight has landed; a failed one is raised or warned
        about as on_error says."""
        self.named.wait()

    # -- teardown --------------------------------------------------------
    @override
    def teardown(self) -> None:
        """Waits for every checkpoint in flight and raises the first write error (on_error="raise")."""
        self.saves.end_run()  # no optimizer step of anyone reaches this plugin any more
        self.named.close()
