"""The process group an async DCP save talks on, and the refusal of the one that deadlocks.

`dcp.async_save` runs its collectives (plan, gather, commit) on a thread of its own. On the job's
default group they interleave with training's own collectives (FSDP2's all-gathers, DDP's
all-reduces) and gloo aborts with a "collective mismatch" — or a rank waits forever. The save
needs a group of its own: `save_group()` is one gloo group, made once per process (on every rank,
in the same order as other groups, like any `new_group`), and None without torch.distributed or
with one rank (where DCP needs none). A FastStager refuses, in one line, an async_save given no
process group while more than one rank runs (`refuse_default_group`).
"""
from __future__ import annotations

import sys
import threading
from typing import Optional

import torch.distributed as dist

from ..commit.agreement import spread

_made: dict[int, object] = {}
_lock = threading.Lock()


def save_group() -> Optional[object]:
    """A gloo group for checkpoint saves, made once per default group; None with one rank."""
    if not spread():
        return None
    key = id(dist.distributed_c10d._get_default_group())
    with _lock:
        if key not in _made:
            _made[key] = dist.new_group(backend="gloo")
        return _made[key]


def refuse_default_group() -> None:
    """Called by FastStager.stage(): when it is reached from dcp.async_save (found on the calling
    thread's stack) and that call got no process_group while more than one rank runs, raises
    ValueError saying what to pass. Anything else (dcp.save, a direct stage(), a stack that does
    not look like DCP's) passes."""
    if not spread():
        return
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "async_save" and frame.f_globals.get("__name__", "").startswith(
                "torch.distributed.checkpoint") and "process_group" in frame.f_locals:
            if frame.f_locals["process_group"] is None:
                raise ValueError("dcp.async_save(..., async_stager=FastStager) needs process_group= a group of "
                                 "its own: on the default group its collectives interleave with training's and "
                                 "gloo aborts; pass process_group=fastckpt.dcp.save_group()")
            return
        frame = frame.f_back
