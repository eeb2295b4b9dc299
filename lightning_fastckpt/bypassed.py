"""Lightning strategies that save distributed checkpoints themselves, said once.

Lightning's ModelParallelStrategy and FSDPStrategy(state_dict_type="sharded") write a
distributed checkpoint with PyTorch DCP directly and never call the CheckpointIO, so a
FastCheckpointIO given to them would be silently unused. `watch(FastCheckpointIO)` (called by
every FastCheckpointIO) wraps those strategies' `save_checkpoint`: once a save returns, a DCP
directory (its `.metadata`) at the path of a strategy whose CheckpointIO is a FastCheckpointIO
means the strategy bypassed it, and the process is told so once, with what to use instead.
`remove_checkpoint` of such a directory says the same (lightning_fastckpt.checkpoint_io).
"""
from __future__ import annotations

import functools
import os
import warnings

from fastckpt.dcp import metadata as md_file

_said = False


def say(path: str) -> None:
    """The warning, once per process."""
    global _said
    if not _said:
        _said = True
        warnings.warn(f"fastckpt: {path} was saved by the strategy itself with PyTorch DCP, not through "
                      "FastCheckpointIO: Lightning's ModelParallelStrategy and FSDPStrategy(state_dict_type="
                      "'sharded') do not use a CheckpointIO for distributed checkpoints. Use "
                      "lightning_fastckpt.FastModelParallelStrategy to save them through fastckpt.", stacklevel=3)


def is_dcp_folder(path: str) -> bool:
    return os.path.isfile(os.path.join(path, md_file.NAME))


def watch(ours: type) -> None:
    """Wraps the bypassing strategies' save_checkpoint (once; subclasses that override it, such
    as FastModelParallelStrategy, are not touched); `ours`: the CheckpointIO class they bypass."""
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
    for cls in (FSDPStrategy, ModelParallelStrategy):
        original = cls.__dict__["save_checkpoint"]
        if getattr(original, "_fastckpt_watched", False):
            continue

        @functools.wraps(original)
        def save_checkpoint(self, checkpoint, filepath, storage_options=None, _original=original):
            _original(self, checkpoint, filepath, storage_options)
            io = self.checkpoint_io  # or a wrapper of it (AsyncCheckpointIO)
            given = isinstance(io, ours) or isinstance(getattr(io, "checkpoint_io", None), ours)
            if given and self.is_global_zero and is_dcp_folder(os.fspath(filepath)):
                say(os.fspath(filepath))

        save_checkpoint._fastckpt_watched = True
        cls.save_checkpoint = save_checkpoint
