"""fastckpt: fast, asynchronous, crash-consistent checkpoints for PyTorch.

The shared backend of the Lightning, DeepSpeed and torchtitan plugins. It imports none of
them. Public API: Checkpointer, save, load (Saved), CommitInfo, Pending, errors, and
reproducible() (what a process does before its first step for runs to repeat bit for bit).
"""
from .errors import (CheckpointWriteError, ConfigError, CorruptCheckpointError, FastckptError,
                     NoCheckpointError, StateMismatchError, TornSnapshotError, UnsafeCheckpointError)
from .checkpointer import Checkpointer
from .commit_info import CommitInfo
from .pending import Pending
from .reproducibility import reproducible
from .save_load import Saved, load, save

__all__ = ["Checkpointer", "CommitInfo", "Pending", "Saved", "save", "load", "reproducible", "FastckptError", "ConfigError", "CorruptCheckpointError",
           "CheckpointWriteError", "NoCheckpointError", "StateMismatchError", "TornSnapshotError",
           "UnsafeCheckpointError"]
__version__ = "0.2.0.dev0"  # the one place; setup.cfg reads it (version = attr:), the CHANGELOG heads with it
