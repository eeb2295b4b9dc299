"""A checkpoint on a signal for DeepSpeed: `at_step_end(engine, save_dir)`.

    config = {..., "fastckpt": {"preempt_signal": "SIGTERM", "preempt_grace_s": 30}}
    for batch in data:
        loss = engine(batch); engine.backward(loss); engine.step()
        deepspeed_fastckpt.at_step_end(engine, save_dir)

The FastckptEngine installs the signal's handler when the engine is made (on the main thread):
it only notes the signal (fastckpt.preempt: no I/O, no collective). at_step_end asks every rank,
in one all-reduce, whether any got it; if one did, every rank saves the tag
`preempted_step<global_steps>` (engine.save_checkpoint, the tag committed by fastckpt's file-set
commit), waits until it is durable, meets the others, and the process exits with the signal's
status. A second signal, or preempt_grace_s running out, ends the process at once; a tag's record
being written last, the previous tag stays the newest, never a torn one.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Union

import torch
import torch.distributed as dist

from .engine import FastckptEngine

if TYPE_CHECKING:
    from deepspeed.runtime.engine import DeepSpeedEngine

TAG = "preempted_step{step}"


def at_step_end(engine: DeepSpeedEngine, save_dir: Union[str, os.PathLike[str]]) -> None:
    """Every rank, after engine.step(): nothing unless the entry's preempt_signal came to some rank
    (then: the agreed tag saved and durable, and exit). Nothing at all without preempt_signal."""
    ours = engine.checkpoint_engine
    p = ours.preempt if isinstance(ours, FastckptEngine) else None
    if p is None:
        return
    tag = TAG.format(step=engine.global_steps)

    def save() -> None:
        engine.save_checkpoint(save_dir, tag=tag)
        ours.wait()  # the tag committed: every file durable, then its record
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
    p.at_step_end(lambda came: _any_rank(came, _device(engine)), f"the tag {tag} in {os.fspath(save_dir)}", save)


def _any_rank(came: bool, device: torch.device) -> bool:
    got = torch.tensor([1 if came else 0], device=device)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(got, op=dist.ReduceOp.MAX)
    return bool(got.item())


def _device(engine: DeepSpeedEngine) -> torch.device:
    try:
        return torch.device(engine.device)
    except (AttributeError, TypeError, RuntimeError):
        return torch.device("cpu")
