"""interval="auto" for DeepSpeed: when a training loop should call save_checkpoint.

    config = {..., "fastckpt": {"interval": "auto", "tune": {"overhead": 0.05}}}
    for batch in data:
        loss = engine(batch); engine.backward(loss); engine.step()
        if deepspeed_fastckpt.checkpoint_due(engine, save_dir):
            engine.save_checkpoint(save_dir)

Owns the AutoInterval (fastckpt.tune.auto_interval) of an engine: the engine's forward feeds it the time
between steps; after the warm-up, checkpoint_due() profiles N x p once under
SAVE_DIR/.fastckpt-tune with this rank's module and optimizer state, reconfigures the
FastckptEngine to N* and p*, and answers by the interval f*. The time between steps is taken
at the first forward of each step (deepspeed_fastckpt.engine_hooks: one step's start to the
next's, the save between them included). An integer "interval" answers
by that. With several ranks the interval in force is the largest any rank chose, agreed by
an all-reduce at tuning and every `window` steps after (so a drift re-tune is agreed too):
every rank must answer the same, or their save_checkpoint collectives would not meet.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal, Optional, Union

import torch

from fastckpt.session import AutoInterval
from fastckpt.errors import ConfigError

from .engine import FastckptEngine
from .engine_hooks import hooks_of, peek
from .settings import interval_of

if TYPE_CHECKING:
    from deepspeed.runtime.engine import DeepSpeedEngine


class _Interval:
    def __init__(self, interval: Union[int, Literal["auto"]], tune: dict) -> None:
        """interval and tune as settings.interval_of checked them."""
        self.auto: Optional[AutoInterval] = AutoInterval(**tune) if interval == "auto" else None
        self.every: Optional[int] = None if interval == "auto" else interval
        self.window = tune.get("window", 20)
        self.last_step_at: Optional[float] = None
        self.saved_in_step = False  # checkpoint_due said yes since the last step boundary

    def step_ended(self, engine: DeepSpeedEngine, now: float) -> None:
        """A step of the engine ended at `now` (engine_hooks: the next step's first forward)."""
        if self.auto is None:
            return
        if self.last_step_at is not None:
            ce = engine.checkpoint_engine
            in_flight = bool(getattr(ce, "in_flight", lambda: 0)())
            self.auto.step_time(now - self.last_step_at, checkpointing=in_flight or self.saved_in_step)
        self.last_step_at = now
        self.saved_in_step = False


def attach(engine: DeepSpeedEngine, entry: dict) -> None:
    """From the entry's "interval" (and "tune") keys, if there."""
    checked = interval_of(entry)
    if checked is not None:
        hooks_of(engine).interval = _Interval(*checked)


def checkpoint_due(engine: DeepSpeedEngine, save_dir: str) -> bool:
    """Whether the engine's current global step is a checkpoint step (see the module doc)."""
    hooks = peek(engine)
    iv = None if hooks is None else hooks.interval
    if iv is None:
        raise ConfigError('checkpoint_due needs "interval" ("auto" or steps) in the "fastckpt" entry')
    step = engine.global_steps
    if iv.auto is None:
        return step > 0 and step % iv.every == 0
    if iv.auto.needs_tuning:
        _tune(engine, iv, save_dir)
        iv.every = _agree(iv.auto.interval)
    elif iv.auto.plan is not None and step % iv.window == 0:
        iv.every = _agree(iv.auto.interval)
    due = iv.every is not None and step > 0 and step % iv.every == 0
    iv.saved_in_step = iv.saved_in_step or due
    return due


def _tune(engine: DeepSpeedEngine, iv: _Interval, save_dir: str) -> None:
    assert iv.auto is not None  # called when iv.auto needs tuning
    state = {"module": engine.module.state_dict(), "optimizer": engine.optimizer.state_dict()}
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    iv.auto.log_path = os.path.join(save_dir, f"fastckpt-tune-rank{rank}.json")
    os.makedirs(save_dir, exist_ok=True)
    plan = iv.auto.tune(state, os.path.join(save_dir, ".fastckpt-tune", f"rank{rank}"))
    if isinstance(engine.checkpoint_engine, FastckptEngine):
        engine.checkpoint_engine.reconfigure(concurrency=plan.concurrency, writers=plan.writers)
    iv.last_step_at = None  # the profiling pause is not a training step


def _agree(interval: Optional[int]) -> Optional[int]:
    if interval is None or not torch.distributed.is_initialized():
        return interval
    t = torch.tensor([interval], dtype=torch.int64)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return int(t.item())
