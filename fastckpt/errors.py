"""Exceptions fastckpt raises; each message says what happened and what to do."""


class FastckptError(Exception):
    """Base class of every fastckpt error."""


class ConfigError(FastckptError, ValueError):
    """A setting is unknown or out of range."""


class CorruptCheckpointError(FastckptError):
    """A checkpoint file or commit record failed validation."""


class CheckpointWriteError(FastckptError, OSError):
    """Writing a checkpoint failed (full disk, I/O error, unwritable directory, ...)."""


class TornSnapshotError(CheckpointWriteError):
    """A tensor was written in place (not by the optimizer) after save() returned and before its
    snapshot was copied: the checkpoint could mix two states, so it was dropped."""


class UnsafeCheckpointError(FastckptError):
    """The file asks to run code (a pickle global that is not allowlisted)."""


class NoCheckpointError(FastckptError, FileNotFoundError):
    """No valid checkpoint exists where one was asked for."""


class StateMismatchError(FastckptError, ValueError):
    """A loaded checkpoint does not fit the structure it is loaded into."""
