"""The one warning that a Lightning strategy saves its distributed checkpoints past FastCheckpointIO.

Lightning's ModelParallelStrategy and FSDPStrategy(state_dict_type="sharded") write distributed
checkpoints with PyTorch DCP themselves and never call their CheckpointIO for them. Said once
per process: at setup (lightning_fastckpt.watch), or when FastCheckpointIO is asked to remove
such a directory (lightning_fastckpt.checkpoint_io).
"""
from __future__ import annotations

import os
import warnings

from fastckpt.dcp import METADATA

BYPASS = ("with PyTorch DCP, not through FastCheckpointIO: Lightning's ModelParallelStrategy and "
          "FSDPStrategy(state_dict_type='sharded') never call their CheckpointIO for distributed checkpoints. "
          "Use lightning_fastckpt.FastModelParallelStrategy to save them through fastckpt.")
_said = False


def say_bypassed(what: str) -> None:
    """`fastckpt: {what} {BYPASS}`, once per process."""
    global _said
    if not _said:
        _said = True
        warnings.warn(f"fastckpt: {what} {BYPASS}", stacklevel=3)


def is_dcp_folder(path: str) -> bool:
    """A directory PyTorch DCP saved (its .metadata is there)."""
    return os.path.isfile(os.path.join(path, METADATA))
