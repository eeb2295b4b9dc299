"""The one warning that a DCP checkpoint has no fastckpt commit record (DCP's own writer wrote it),
said once per checkpoint and process: by whoever meets it first — newest_committed picking it
(fastckpt.dcp.committed) or FastStorageReader reading it (fastckpt.dcp.reader). A resume that
does both, as torchtitan's does, warns once, as docs/dcp.md says.
"""
from __future__ import annotations

import os
import warnings

_said: set[str] = set()  # the checkpoints a warning has named, by real path


def warn_stock_once(directory: str, message: str, stacklevel: int = 2) -> None:
    key = os.path.realpath(os.fspath(directory))
    if key not in _said:
        _said.add(key)
        warnings.warn(message, stacklevel=stacklevel + 1)
