"""Where checkpoints live: every store implements the protocol of protocol.py.

  protocol.py    the store seam, its calls numbered (Store), and the optional ByPath
  root_store.py  "root": fastckpt names each checkpoint, a directory per checkpoint under the root
                 and a `latest` pointer (the Checkpointer's own layout); ahead.py: each rank's next
                 file made before its save
  path_store.py  "path": every save names its own path (a local file, a per-rank directory, a
                 URL: url_files.py, s3:// through s3/client.py, others through fsspec), as Lightning does
  pmem_store.py  "pmem": versions of a model in a persistent-memory pool (a DAX device or file,
                 or a file on /dev/shm); with model=None, models named by path
  s3/            "s3": the root store's layout in a bucket (root='s3://bucket/prefix'), committed by
                 a record object written once, parts uploaded from a local spool
  tiers.py       `tiers`: the tier composition — memory tiers (node_tier.py: each rank's folder) in
                 front of one store, each save persisted behind from its committed copy (tier_copy.py);
                 what lies behind is one of two kinds:
  tiered_store.py  the root's layout on a disk or in a bucket, read back from the fastest tier;
                 `replicas=1`: each part kept by a partner rank too (replicas.py, partners.py)
  named_tiers.py  the caller's paths (store 'path'), local or s3:// (path_tier.py: the path as the
                 tier behind, and the index of what each path holds; s3/object_path.py: an s3:// one)
"""
from __future__ import annotations

from ..errors import ConfigError
from .path_store import PathStore
from .pmem_store import PmemStore
from .protocol import ByPath, Store
from .root_store import RootStore
from .node_tier import NodeTier
from .tiered_store import TieredStore
from .named_tiers import NamedTiers
from .s3.s3_store import S3Store

STORES: dict[str, type[Store]] = {cls.kind: cls for cls in (RootStore, S3Store, PathStore, PmemStore)}
# what `fastckpt ls` asks of a folder, in order: a rank's folder of a memory tier before a root
SURVEYED: tuple[type[Store], ...] = (NodeTier, *STORES.values())


def open_store(config, rank: int = 0, world_size: int = 1) -> Store:
    """The store a validated CheckpointerConfig names, for this rank of world_size (its tiers,
    when it names them: a memory tier in front of the root, or of the caller's paths)."""
    if getattr(config, "tiers", None):
        return (NamedTiers if config.store == "path" else TieredStore).open(config, rank, world_size)
    cls = STORES.get(config.store)
    if cls is None:
        raise ConfigError(f"unknown store {config.store!r}; available here: {', '.join(STORES)}")
    return cls.open(config, rank, world_size)


__all__ = ["ByPath", "PathStore", "PmemStore", "NamedTiers", "NodeTier", "RootStore", "S3Store", "STORES", "SURVEYED", "Store", "TieredStore", "open_store"]
