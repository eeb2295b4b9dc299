"""Where checkpoints live.

"root": fastckpt names each checkpoint: a directory per checkpoint under the root, and a `latest` pointer
        (the Checkpointer's own layout; "file" is its earlier name, still accepted).
"path": every save names its own path (local file, per-rank directory, or fsspec URL), as Lightning does.
"pmem": versions of a model in a persistent-memory pool (a DAX device or file, or a file on /dev/shm).
"""
from __future__ import annotations

from ..errors import ConfigError
from .root_store import RootStore
from .path_store import PathStore

STORES = ("root", "path", "pmem")
EARLIER_NAMES = {"file": "root"}  # a store's earlier name -> its name


def store_name(kind):
    """The store's name, for an earlier spelling of it too (store="file" is store="root");
    CheckpointerConfig reads every store setting through it."""
    return EARLIER_NAMES.get(kind, kind) if isinstance(kind, str) else kind


def open_store(kind: str, root, per_rank: bool = False, **pool):
    """pool: model, pool_mb, persist, concurrency, rank, world_size (store='pmem' only)."""
    if kind == "root":
        if root is None:
            raise ConfigError("store='root' needs a root directory")
        return RootStore(root)
    if kind == "path":
        return PathStore(per_rank=per_rank)
    if kind == "pmem":
        from .pmem_store import PoolStore
        return PoolStore(root, **pool)
    raise ConfigError(f"unknown store {kind!r}; available here: {', '.join(STORES)} "
                      "(the gds store is a separate issue of the roadmap)")
