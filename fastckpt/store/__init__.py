"""Where checkpoints live.

"file": a root directory of checkpoint directories with a `latest` pointer (the Checkpointer's own layout).
"path": every save names its own path (local file, per-rank directory, or fsspec URL), as Lightning does.
"""
from __future__ import annotations

from ..errors import ConfigError
from .file_store import FileStore
from .path_store import PathStore

STORES = ("file", "path")


def open_store(kind: str, root, per_rank: bool = False):
    if kind == "file":
        if root is None:
            raise ConfigError("store='file' needs a root directory")
        return FileStore(root)
    if kind == "path":
        return PathStore(per_rank=per_rank)
    raise ConfigError(f"unknown store {kind!r}; available here: {', '.join(STORES)} "
                      "(the pmem and gds stores are separate issues of the roadmap)")
