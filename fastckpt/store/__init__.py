"""Where checkpoints live.

"file": a root directory of checkpoint directories with a `latest` pointer (the Checkpointer's own layout).
"path": every save names its own path (local file, per-rank directory, or fsspec URL), as Lightning does.
"pmem": versions of a model in a persistent-memory pool (a DAX device or file, or a file on /dev/shm).
"""
from __future__ import annotations

from ..errors import ConfigError
from .file_store import FileStore
from .path_store import PathStore

STORES = ("file", "path", "pmem")


def open_store(kind: str, root, per_rank: bool = False, **pool):
    """pool: model, pool_mb, persist, concurrency, rank, world_size (store='pmem' only)."""
    if kind == "file":
        if root is None:
            raise ConfigError("store='file' needs a root directory")
        return FileStore(root)
    if kind == "path":
        return PathStore(per_rank=per_rank)
    if kind == "pmem":
        from .pmem_store import PoolStore
        return PoolStore(root, **pool)
    raise ConfigError(f"unknown store {kind!r}; available here: {', '.join(STORES)} "
                      "(the gds store is a separate issue of the roadmap)")
