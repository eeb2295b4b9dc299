"""DCP's `.metadata` file: written as DCP writes it, read without running code from it.

DCP pickles its Metadata (what each key of the state is, where each item lies) into
`.metadata`; its stock reader unpickles it with plain pickle. fastckpt writes it the same way
(so the stock reader loads our checkpoints) — durably, through the one atomic write — and reads
it through the restricted unpickler (fastckpt.format.safe_unpickler) with DCP's own metadata
types allowed and nothing else: a crafted `.metadata` is refused, never run.
"""
from __future__ import annotations

import pathlib
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import metadata as md
from torch.distributed.checkpoint import filesystem as dcp_files

from ..errors import CorruptCheckpointError
from ..format.safe_unpickler import unpickle
from ..fsutil import write_atomic

NAME = ".metadata"
MAX_BYTES = 1 << 30
WRITTEN_BY = "fastckpt"  # in storage_meta.modules: a reader knows a commit record must be there

# the types a .metadata pickle is made of (dataclasses of torch.distributed.checkpoint.metadata,
# the filesystem's per-item storage info; two of them private to DCP, which pickles them); torch.Size, dtypes and layouts are allowed anyway
_TYPES: list[Any] = [md.Metadata, md.MetadataIndex, md.TensorStorageMetadata, md.BytesStorageMetadata,
          md.ChunkStorageMetadata, md.TensorProperties, md._MEM_FORMAT_ENCODING, md.StorageMeta,
          dcp_files._StorageInfo,
          pathlib.PosixPath, pathlib.PurePosixPath]  # the stock writer's checkpoint_id is a Path


def encode(metadata: md.Metadata) -> bytes:
    return pickle.dumps(metadata)


def write(path: str, metadata: md.Metadata) -> bytes:
    """Durably at path (tmp, fsync, rename, directory fsync); returns the bytes written."""
    raw = encode(metadata)
    write_atomic(path, raw)
    return raw


def decode(raw: bytes, path: str) -> md.Metadata:
    def no_storage(pid: object) -> None:
        raise CorruptCheckpointError(f"{path}: DCP metadata refers to a storage")

    with torch.serialization.safe_globals(_TYPES):
        value = unpickle(raw, no_storage, path)
    if not isinstance(value, md.Metadata) or not isinstance(value.state_dict_metadata, dict):
        raise CorruptCheckpointError(f"{path}: not DCP metadata ({type(value).__name__})")
    return value


def written_by_fastckpt(metadata: md.Metadata) -> bool:
    meta = getattr(metadata, "storage_meta", None)
    return WRITTEN_BY in (getattr(meta, "modules", None) or [])
