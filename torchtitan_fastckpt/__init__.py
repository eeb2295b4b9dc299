"""fastckpt for torchtitan: its checkpointing through fastckpt.dcp in one config line.

    from torchtitan_fastckpt import CheckpointManager
    config = Trainer.Config(..., checkpoint=CheckpointManager.Config(interval=500, async_mode="async"))

`CheckpointManager` is torchtitan's own `CheckpointManager` (torchtitan.components.checkpointer),
its saves written by `FastStorageWriter`, staged by `FastStager` and read by
`FastStorageReader`; a run resumes from the newest checkpoint it can use, whoever wrote it
(fastckpt.dcp.newest_committed). See manager.py.
"""
from __future__ import annotations

from typing import Any

__all__ = ["CheckpointManager"]


def __getattr__(name: str) -> Any:
    if name == "CheckpointManager":
        from .manager import CheckpointManager
        value = CheckpointManager
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return value
