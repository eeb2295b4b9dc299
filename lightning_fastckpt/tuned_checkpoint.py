"""TunedModelCheckpoint: Lightning's ModelCheckpoint with `every_n_train_steps="auto"`.

    Trainer(plugins=[FastCheckpointIO()],
            callbacks=[TunedModelCheckpoint(dirpath="ckpts", every_n_train_steps="auto", overhead=0.05)])

Owns the interval of a ModelCheckpoint (Lightning's owner of "when"; FastCheckpointIO is
"how"): the first `warmup_steps` training steps are timed without saving, then the tuner
(fastckpt.tune.auto_interval.AutoInterval: PCcheck's N*, p*, f*) profiles N x p with this
trainer's real checkpoint on the checkpoint directory's disk, sets every_n_train_steps = f*,
and gives FastCheckpointIO concurrency N* and writers p* (when the trainer uses one). The
step time keeps being watched, each step marked when a checkpoint was saved or in flight in
it: a drift beyond `drift`, or a measured cost per checkpoint that breaks the budget,
re-chooses the interval. The plan and
its measurements go to the log and to DIRPATH/fastckpt-tune.json. With an integer
every_n_train_steps it is a plain ModelCheckpoint.
"""
from __future__ import annotations

import os
import time
from typing import Any, Iterable, Literal, Optional, Union

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from fastckpt.session import AutoInterval

from .checkpoint_io import FastCheckpointIO


class TunedModelCheckpoint(ModelCheckpoint):
    def __init__(self, dirpath: Optional[str] = None, every_n_train_steps: Union[int, Literal["auto"], None] = "auto",
                 overhead: float = 0.05, drift: float = 0.2, warmup_steps: int = 5,
                 ns: Iterable[int] = (1, 2, 4), ps: Iterable[int] = (1, 2, 4),
                 repeats: int = 1, host_bytes: Optional[int] = None, storage_bytes: Optional[int] = None,
                 **kwargs: Any) -> None:
        self.auto: Optional[AutoInterval] = None
        if every_n_train_steps == "auto":
            self.auto = AutoInterval(overhead, drift, warmup_steps, ns=ns, ps=ps, repeats=repeats,
                                     host_bytes=host_bytes, storage_bytes=storage_bytes)
            kwargs.setdefault("every_n_epochs", 0)  # nothing is saved until the interval is chosen
            every_n_train_steps = None
        super().__init__(dirpath=dirpath, every_n_train_steps=every_n_train_steps, **kwargs)
        self._t0: Optional[float] = None
        self._saved_in_step = False
        self.tune_seconds = 0.0
        self._told = 0  # plans already told to the user

    @override
    def on_train_batch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any,
                             batch_idx: int) -> None:
        now = time.perf_counter()
        if self.auto is not None and self._t0 is not None:
            io = trainer.strategy.checkpoint_io
            in_flight = isinstance(io, FastCheckpointIO) and io.in_flight() > 0
            self.auto.step_time(now - self._t0, checkpointing=self._saved_in_step or in_flight)
            self._tell()
            if self.auto.plan is not None:
                self._every_n_train_steps = self.auto.plan.interval  # follows a re-tune
        self._t0 = now
        self._saved_in_step = False

    @override
    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: STEP_OUTPUT,
                           batch: Any, batch_idx: int) -> None:
        if self.auto is not None and self.auto.needs_tuning and trainer.is_global_zero:
            self._tune(trainer)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self._saved_in_step = self._last_global_step_saved == trainer.global_step

    def _tell(self) -> None:
        """Each new plan, where Lightning shows its own messages (the `fastckpt` logger is not)."""
        assert self.auto is not None  # called with every_n_train_steps="auto" alone
        for event in self.auto.history[self._told:]:
            rank_zero_info(f"fastckpt {event['event']}: concurrency={event['concurrency']} "
                           f"writers={event['writers']}, a checkpoint every {event['interval']} steps "
                           f"(step {event['step_s'] * 1e3:.0f} ms)")
        self._told = len(self.auto.history)

    def _tune(self, trainer: "pl.Trainer") -> None:
        assert self.auto is not None  # called with every_n_train_steps="auto" alone
        t0 = time.perf_counter()
        directory = self.dirpath or os.path.join(trainer.default_root_dir, "checkpoints")
        os.makedirs(directory, exist_ok=True)
        self.auto.log_path = os.path.join(directory, "fastckpt-tune.json")
        strategy = trainer.strategy  # what a checkpoint of this run holds, through the strategy's public calls
        state = {"state_dict": strategy.lightning_module_state_dict(),
                 "optimizer_states": [strategy.optimizer_state(o) for o in trainer.optimizers]}
        plan = self.auto.tune(state, os.path.join(directory, ".fastckpt-tune"))
        io = trainer.strategy.checkpoint_io
        if isinstance(io, FastCheckpointIO):
            io.reconfigure(concurrency=plan.concurrency, writers=plan.writers)
        self._every_n_train_steps = plan.interval
        self.tune_seconds = time.perf_counter() - t0
        self._tell()
        self._t0 = None  # the profiling pause is not a training step
