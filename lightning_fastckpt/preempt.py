"""A checkpoint on a signal in Lightning: the callback `PreemptCheckpoint`.

Lightning closed "save on SIGTERM" as won't-fix, and its SLURM requeue saves inside the signal
handler, where its users report hangs (its SIGTERM handler also broadcasts from rank 0 inside the
handler, so a rank other than 0 that gets the signal joins a collective the others are not in).
While training, this callback's handler takes the signal's place (Lightning's is back after
fit); it only notes the signal (fastckpt.preempt: no I/O, no collective); at the next training batch's end every rank agrees — in one collective,
the strategy's `reduce_boolean_decision` — on that step; the trainer saves it through its own
CheckpointIO (FastCheckpointIO, or any other), which is then torn down (everything it has in
flight durable), the ranks meet, and the process exits with the signal's status. A second
signal, or `grace_s` running out (from the signal), ends the process at once: the checkpoint's
commit record being written last, the previous checkpoint stays the newest, never a torn one.
Once the checkpoint is durable, Lightning's `last` (what `fit(ckpt_path="last")` resolves) is made
a link to it, as ModelCheckpoint(save_last="link") makes its own: a resume from "last" is a
resume from the preemption.
"""
from __future__ import annotations

import logging
import os
import signal as signals
from typing import Any, Optional, Union

import lightning.pytorch as pl
from lightning.pytorch.utilities.types import STEP_OUTPUT

from fastckpt.session import PreemptSignal, fsync_dir, signal_number

log = logging.getLogger("fastckpt")


class PreemptCheckpoint(pl.Callback):
    """On `signal` (default SIGTERM): one checkpoint of the step every rank agrees on, in
    `dirpath`, named `filename` (its `{step}` the global step), then exit.

        trainer = Trainer(plugins=[FastCheckpointIO()],
                          callbacks=[PreemptCheckpoint("ckpts", grace_s=30)])

    Once it is durable, the `last` checkpoint of the trainer's ModelCheckpoint (each one with
    save_last; else the first one's folder) links to it (point_last_at), so that
    `Trainer.fit(ckpt_path="last")` resumes from it, as from any newest checkpoint.
    """

    def __init__(self, dirpath: Union[str, os.PathLike[str]], signal: Union[int, str] = signals.SIGTERM,
                 grace_s: float = 30.0, filename: str = "preempted-step={step}.ckpt") -> None:
        self.dirpath, self.filename, self.grace_s = os.fspath(dirpath), filename, float(grace_s)
        self.signum = signal_number(signal)
        self._signal: Optional[PreemptSignal] = None

    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        """Installed once Lightning installed its own (its SignalConnector, just before training),
        and in its place: Lightning's SIGTERM handler broadcasts from inside the handler, which
        pairs with whatever collective the interrupted rank was in."""
        if self._signal is None:
            if self.signum is None:
                raise TypeError("PreemptCheckpoint(signal=None): it needs a signal to checkpoint on")
            self._signal = PreemptSignal(self.signum, self.grace_s)

    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: STEP_OUTPUT,
                           batch: Any, batch_idx: int) -> None:
        if self._signal is None:
            return
        path = os.path.join(self.dirpath, self.filename.format(step=trainer.global_step))

        def save() -> None:
            trainer.save_checkpoint(path)
            trainer.strategy.checkpoint_io.teardown()  # what it has in flight, durable
            if trainer.is_global_zero:
                point_last_at(trainer, path)
            trainer.strategy.barrier("fastckpt-preempted")
        self._signal.at_step_end(lambda came: trainer.strategy.reduce_boolean_decision(came, all=False),
                                 f"step {trainer.global_step} to {path}", save)

    def teardown(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        if self._signal is not None and self._signal.arrived is None:
            self._signal.uninstall()
            self._signal = None  # a next fit installs it again


def last_links(trainer: "pl.Trainer") -> list[str]:
    """Where `Trainer.fit(ckpt_path="last")` looks, as Lightning resolves it: the `last` file of every
    ModelCheckpoint that saves one (save_last), or, when none does, of the trainer's first
    ModelCheckpoint (Lightning looks in every ModelCheckpoint's folder); none without one."""
    from lightning.pytorch.callbacks import ModelCheckpoint
    callbacks = [cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint) and cb.dirpath]
    saving = [cb for cb in callbacks if cb.save_last] or callbacks[:1]
    return [cb.format_checkpoint_name(dict(trainer.callback_metrics), cb.CHECKPOINT_NAME_LAST) for cb in saving]


def point_last_at(trainer: "pl.Trainer", path: str) -> None:
    """Rank 0, once the checkpoint at path is durable: every `last` Lightning's ckpt_path="last" reads
    becomes a link to it, as ModelCheckpoint(save_last="link") makes its own — atomically (a link
    made beside it, renamed over it) and durably (its folder synced). Lightning resolves "last" by
    modification time among those files, so the link (the preemption checkpoint's time, the newest)
    is what a resume reads; the next `last` ModelCheckpoint saves replaces the link itself."""
    for link in last_links(trainer):
        if os.path.abspath(link) == os.path.abspath(path):
            continue
        try:
            os.makedirs(os.path.dirname(link), exist_ok=True)
            made = f"{link}.fastckpt-link-{os.getpid()}"
            os.symlink(os.path.relpath(path, os.path.dirname(link)), made)
            os.replace(made, link)
            fsync_dir(os.path.dirname(link))
        except OSError as e:  # the checkpoint itself is durable: resume from its path
            log.error("fastckpt: could not make %s point to the preemption checkpoint %s: %s", link, path, e)
