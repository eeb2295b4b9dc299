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
"""
from __future__ import annotations

import logging
import os
import signal as signals
from typing import Optional

import lightning.pytorch as pl

from fastckpt.preempt import PreemptSignal, signal_number

log = logging.getLogger("fastckpt")


class PreemptCheckpoint(pl.Callback):
    """On `signal` (default SIGTERM): one checkpoint of the step every rank agrees on, in
    `dirpath`, named `filename` (its `{step}` the global step), then exit.

        trainer = Trainer(plugins=[FastCheckpointIO()],
                          callbacks=[PreemptCheckpoint("ckpts", grace_s=30)])
    """

    def __init__(self, dirpath, signal=signals.SIGTERM, grace_s: float = 30.0,
                 filename: str = "preempted-step={step}.ckpt"):
        self.dirpath, self.filename, self.grace_s = os.fspath(dirpath), filename, float(grace_s)
        self.signum = signal_number(signal)
        self._signal: Optional[PreemptSignal] = None

    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        """Installed once Lightning installed its own (its SignalConnector, just before training),
        and in its place: Lightning's SIGTERM handler broadcasts from inside the handler, which
        pairs with whatever collective the interrupted rank was in."""
        if self._signal is None:
            self._signal = PreemptSignal(self.signum, self.grace_s)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        p = self._signal
        if p is None or not p.anyone(lambda came: trainer.strategy.reduce_boolean_decision(came, all=False)):
            return
        p.watch()  # the grace period runs (from now, if another rank got the signal)
        path = os.path.join(self.dirpath, self.filename.format(step=trainer.global_step))
        log.warning("fastckpt: preempted (signal %d): checkpointing step %d to %s, then exiting (%.1f s of grace "
                    "left)", p.signum, trainer.global_step, path, p.left_s())
        try:
            trainer.save_checkpoint(path)
            trainer.strategy.checkpoint_io.teardown()  # what it has in flight, durable
            trainer.strategy.barrier("fastckpt-preempted")
        except BaseException as e:  # noqa: BLE001 - the process ends either way; the previous checkpoint stands
            log.error("fastckpt: the checkpoint of step %d on preemption failed: %s", trainer.global_step, e)
        p.exit()

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self._signal is not None and self._signal.arrived is None:
            self._signal.uninstall()
            self._signal = None  # a next fit installs it again
