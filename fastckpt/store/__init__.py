"""Where checkpoints live. "file": a directory of checkpoint directories (SSD/disk)."""
from __future__ import annotations

from ..errors import ConfigError
from .file_store import FileStore

STORES = ("file",)


def open_store(kind: str, root: str) -> FileStore:
    if kind == "file":
        return FileStore(root)
    raise ConfigError(f"unknown store {kind!r}; available here: {', '.join(STORES)} "
                      "(the pmem and gds stores are separate issues of the roadmap)")
