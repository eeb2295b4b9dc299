"""What fastckpt does around a DeepSpeed engine's training loop, through the engine's own module hooks.

A DeepSpeedEngine is a torch.nn.Module, and `loss = engine(batch)` runs its forward pre-hooks
and forward hooks; nothing of DeepSpeedEngine is replaced. One pair per engine, registered
when the engine is configured with a "fastckpt" entry (deepspeed_fastckpt.register):
- before the forward: the first forward of a new step (DeepSpeed's `global_steps` moved: it
  does so at every optimizer step, a skipped fp16 step included) ends the step before it — the
  activation offload removes what that step offloaded and backward never used, and
  interval="auto" is fed the time between steps (deepspeed_fastckpt.interval); then, with
  gradients on, the offload's saved-tensor hooks are entered for this forward;
- after the forward (also when it raised: `always_call`): they are left; a forward that raised
  removes its files at once.
Backward needs no hook: the offload removes each file after its last use, and closes the step
once every activation it offloaded was used (ActivationOffload(close_when_used=True)).
"""
from __future__ import annotations

import sys
import time
import weakref
from typing import Any, Optional

import torch

from fastckpt.session import ActivationOffload


class EngineHooks:
    """fastckpt's state beside one engine (never stored on the engine itself)."""

    def __init__(self):
        self.offload: Optional[ActivationOffload] = None
        self.interval: Any = None  # deepspeed_fastckpt.interval's _Interval, for "interval" in the entry
        self.step: Optional[int] = None  # the engine's global_steps at the last forward
        self.entered: list = []  # saved-tensor hook contexts entered by forwards still running


_of: "weakref.WeakKeyDictionary[torch.nn.Module, EngineHooks]" = weakref.WeakKeyDictionary()


def hooks_of(engine) -> EngineHooks:
    """The engine's EngineHooks; the first call registers the pair of module hooks."""
    hooks = _of.get(engine)
    if hooks is None:
        hooks = _of[engine] = EngineHooks()
        engine.register_forward_pre_hook(_before_forward)
        engine.register_forward_hook(_after_forward, always_call=True)
    return hooks


def peek(engine) -> Optional[EngineHooks]:
    """The engine's EngineHooks if it has any (registers nothing)."""
    return _of.get(engine)


def _before_forward(engine, args) -> None:
    hooks = _of.get(engine)
    if hooks is None:
        return
    if hooks.step != engine.global_steps:  # a new step: the one before it ended
        first = hooks.step is None
        hooks.step = engine.global_steps
        if hooks.offload is not None:
            hooks.offload.close()
        if hooks.interval is not None and not first:
            hooks.interval.step_ended(engine, time.perf_counter())
    off = hooks.offload
    if off is not None and torch.is_grad_enabled():
        off.start()
        context = off.hooks()
        context.__enter__()
        hooks.entered.append(context)


def _after_forward(engine, args, output) -> None:
    hooks = _of.get(engine)
    if hooks is None or not hooks.entered:
        return
    hooks.entered.pop().__exit__(None, None, None)
    if sys.exc_info()[1] is not None and hooks.offload is not None:  # called from the forward's except clause
        hooks.offload.close()
