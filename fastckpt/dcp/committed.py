"""Which DCP checkpoints of a folder fastckpt committed, newest first — where a run resumes from.

A folder of DCP checkpoints (torchtitan's `step-N`, one directory per save) holds committed ones,
one whose save was killed before its commit, and anything else. A checkpoint is committed when
its record (`fastckpt-dcp.json`, fastckpt.dcp.writer) is intact and every file it names is there
at its size; newest is the highest record counter (each commit's is one above any before it in
the folder). Item CRCs are checked when the checkpoint is read (FastStorageReader).
"""
from __future__ import annotations

import os
from typing import Optional

from ..commit import record
from ..commit.record import CommitInfo
from ..errors import CorruptCheckpointError
from .writer import RECORD


def committed(parent) -> list[CommitInfo]:
    """Every committed DCP checkpoint directly under parent, newest first."""
    parent = os.fspath(parent)
    found = []
    for name in os.listdir(parent) if os.path.isdir(parent) else []:
        try:
            found.append(record.read(os.path.join(parent, name), RECORD, every_rank=False))
        except (OSError, CorruptCheckpointError):
            continue  # not a checkpoint, never committed, or damaged: not one to resume from
    return sorted(found, key=lambda info: info.counter, reverse=True)


def newest_committed(parent) -> Optional[str]:
    """The directory of the newest committed DCP checkpoint under parent (None: there is none)."""
    found = committed(parent)
    return found[0].path if found else None
