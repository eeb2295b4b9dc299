"""FastCheckpointIO: Lightning's (and Fabric's) CheckpointIO over fastckpt's asynchronous Checkpointer.

Owns the mapping from Lightning's calls to fastckpt: each `save_checkpoint(ckpt, path)`
is one checkpoint written at exactly `path` (an ordinary `.ckpt` file `torch.load`
reads) by the `path` store; it returns once the snapshot is issued, the optimizer update
waiting for the copies it would overwrite (fastckpt.session.TrainingSession). Outside a training
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
import weakref
from typing import Any, Callable, Mapping, Optional, Union

from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from typing_extensions import override

from fastckpt.errors import CheckpointWriteError, ConfigError
from fastckpt.session import BY_PATH, DEFAULTS, PLACEMENT, CheckpointerConfig, TrainingSession, flatten, placed

from .bypass_warning import is_dcp_folder, say_bypassed


MADE: "weakref.WeakSet[FastCheckpointIO]" = weakref.WeakSet()  # the instances alive in this process


class FastCheckpointIO(CheckpointIO):
    """Asynchronous, crash-safe checkpoints for `Trainer(plugins=[FastCheckpointIO(...)])`.

    Args:
        settings: how checkpoints are written — fastckpt.settings.CheckpointerConfig's fields
            (strategy, concurrency, writers, chunk_mb, staging_mb, format, policy, verify,
            on_error, stall_timeout_s, ...: each one's default and doc are there), as keywords
            (`FastCheckpointIO(strategy="c", concurrency=2)`; an unknown one is a ConfigError
            naming the valid ones) or as one CheckpointerConfig. Where checkpoints live, how many
            are kept and which ranks save are Lightning's (its paths, ModelCheckpoint, the
            strategy), not settings here.
        per_rank: every rank saves (sharded strategies): the path becomes a directory with one
            file per rank and a COMMIT record written once all ranks are durable.
        layerwise: hold each snapshot until its DDP gradient bucket is final (needs the
            `LayerwiseCheckpointing` callback, which sets this).
        pool: a persistent-memory pool (/dev/daxN.M, a file on an fsdax mount or on /dev/shm):
            each checkpoint path becomes a model of the pool instead of a file (with the settings
            pool_mb and persist, docs/pmem.md).

    The settings' `tiers` put a memory tier in front of Lightning's paths, e.g.
    `FastCheckpointIO(tiers=["/dev/shm/run7"])` (`tier_keep`: how many copies it keeps, [1] by
    default): each save commits there at memory speed and is persisted to its path from that copy;
    loading a path reads the memory copy of the file there when one verifies (docs/tiers.md). Not
    with per_rank or pool.
    """

    def __init__(self, settings: Optional[Union[CheckpointerConfig, Mapping[str, Any]]] = None, *,
                 per_rank: bool = False, layerwise: bool = False, pool: Optional[str] = None,
                 **overrides: Any) -> None:
        MADE.add(self)  # Trainers made from now on get lightning_fastckpt.watch's callback
        self.pool = os.fspath(pool) if pool is not None else None
        self.per_rank, self.layerwise = per_rank, layerwise
        config = placed(settings, overrides, pool=self.pool, distributed=None if per_rank else False)
        if config.tiers and per_rank:
            raise ConfigError("FastCheckpointIO(tiers=...) keeps each process's own checkpoints in its memory "
                              "tier; per_rank saving (every rank's part of one path) is not supported with it")
        session = TrainingSession(config)  # checked and placed first: nothing installed for a refused one
        self.named, self.saves = session.named, session
        self.verify = self.named.config.verify
        self._decide: Optional[Callable[[bool], bool]] = None  # see agree_on_errors
        self.stats = {"saves": 0}

    def __repr__(self) -> str:
        changed = {k: v for k, v in self._settings().items() if getattr(DEFAULTS, k) != v}
        changed.update({k: v for k, v in self._own().items() if v})
        return f"FastCheckpointIO({', '.join(f'{k}={v!r}' for k, v in changed.items())})"

    def _settings(self) -> dict:
        """The settings it writes with (its memory tier's included)."""
        config = self.named.config
        return dict(self.named.settings, **{k: getattr(config, k) for k in BY_PATH if getattr(config, k) is not None})

    def _own(self) -> dict:
        """This plugin's own arguments (not Checkpointer settings)."""
        return {"per_rank": self.per_rank, "layerwise": self.layerwise, "pool": self.pool}

    def __getstate__(self) -> dict:
        """Pickled (ddp_spawn sends the trainer to its processes, torch.save(trainer)) as its
        settings: the copy is a fresh plugin; saves in flight stay with the original."""
        return {"settings": self._settings(), **self._own()}

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        type(self).__init__(self, **state.pop("settings"), **state)

    @classmethod
    def from_config(cls, cfg: Any) -> "FastCheckpointIO":
        """From a Hydra/OmegaConf config or dict with fastckpt's field names (fastckpt.settings.PLACEMENT's
        are Lightning's here and ignored, but tiers and tier_keep: the memory tier in front of its
        paths); per_rank, layerwise and pool are this plugin's own."""
        flat = {k: v for k, v in flatten(cfg).items() if k not in PLACEMENT or (k in BY_PATH and v is not None)}
        own: dict[str, Any] = {k: flat.pop(k) for k in ("per_rank", "layerwise", "pool") if k in flat}
        return cls(**flat, **own)

    # -- saving ----------------------------------------------------------
    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Union[str, os.PathLike[str]],
                        storage_options: Optional[Any] = None) -> None:
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
            self.saves.reserve_ahead = running  # armed again by this save: see TrainingSession
            try:
                self.named.wait()
                pending.wait()
            finally:
                self.named.close()

    # -- loading ---------------------------------------------------------
    @override
    def load_checkpoint(self, path: Union[str, os.PathLike[str]], map_location: Optional[Any] = None,
                        weights_only: Optional[bool] = None) -> dict[str, Any]:
        self.saves.gate.install()  # a resume starts a run
        self.saves.reserve_ahead = True
        return self.named.load(os.fspath(path), map_location, self.verify, True if weights_only is None else weights_only)

    # -- removing --------------------------------------------------------
    @override
    def remove_checkpoint(self, path: Union[str, os.PathLike[str]]) -> None:
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

    # -- errors on every rank ----------------------------------------------
    def agree_on_errors(self, decide: Optional[Callable[[bool], bool]]) -> None:
        """decide(this_rank_raises) -> whether any rank raises, in one collective of every process of
        the job (a Trainer of several ranks whose rank 0 alone saves: lightning_fastckpt.watch sets
        Lightning's strategy's). While set, a save does not raise an earlier failed one by itself
        (rank 0 raising inside Trainer.save_checkpoint would leave the others in its barrier until
        the process group times out): `raise_agreed`, which every rank calls before each save,
        raises it on every rank. None: each save raises it, as when used alone."""
        self._decide = decide
        self.named.raise_at_save = decide is None
        if self.named.opened:
            self.named.checkpointer.raise_at_save = decide is None

    def raise_agreed(self) -> None:
        """Every rank, at once (before each save): a save that failed on the rank that saves is raised
        on every rank (or, with on_error='warn', warned about there and training goes on everywhere)."""
        if self._decide is None:
            return
        errors = self.named.take_errors()
        raising = any(self.named.checkpointer.raises(e) for e in errors)
        if not self._decide(raising):
            for e in errors:
                self.named.checkpointer.report_failure(e)  # warned about
            return
        for e in errors:
            self.named.checkpointer.report_failure(e)
        raise CheckpointWriteError("a checkpoint failed on the rank that saves it (its error is raised there, at "
                                   "this same save): every rank stops here")

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
