"""Checking one file of a DCP checkpoint, every byte read: what `fastckpt verify` does to it.

`.metadata`: the bytes its commit record names (size, CRC-32), and DCP metadata when read by
the restricted unpickler. A data file (`*.distcp`, DCP's FileSystemWriter's or ours): each
tensor item is a torch.save archive at the offset `.metadata` gives; its structure is parsed
and each of its records checked against the archive's own CRC-32 — a damaged item is named by
its key in the state. A file fastckpt wrote is also checked whole against its commit record
(its CRC-32 covers the byte items and the gaps too), and damage no archive explains is placed
by the record's chunk CRCs. Byte items are torch.save archives as well: parsed, their pickle
run through the restricted unpickler (an item naming a global off the allowlist says UNSAFE).
A file DCP's own writer wrote has no CRC over its byte items: their structure is checked only
(said in the line).
"""
from __future__ import annotations

import os
import zlib
from typing import Optional

from torch.distributed.checkpoint.metadata import BytesStorageMetadata

from ..commit.record import plain_name
from ..commit_info import FileEntry
from ..errors import CorruptCheckpointError, UnsafeCheckpointError
from ..format.reading import range_crcs
from ..format.zip_reader import read_index
from ..fsutil import read_regular
from ..verify import bad_chunk, verify_one
from . import metadata as md_file
from .reader import check_archive, safe_byte_item
from .names import SUFFIX


def read_metadata(directory: str, entry: Optional[FileEntry] = None):
    """The checkpoint's DCP metadata, refused when it is not the bytes its record names."""
    path = os.path.join(directory, md_file.NAME)
    raw = read_regular(path, md_file.MAX_BYTES)
    if entry is not None and (len(raw) != entry.bytes or zlib.crc32(raw) != entry.crc32):
        raise CorruptCheckpointError(f"{path} is not the one its commit record names (replaced or damaged)")
    return md_file.decode(raw, path)


def check_file(path: str, entry: Optional[FileEntry] = None) -> str:
    """Raises CorruptCheckpointError naming the damage; returns a one-line summary."""
    directory, name = os.path.split(path)
    if name == md_file.NAME:
        metadata = read_metadata(directory, entry)
        return f"{path}: DCP metadata of {len(metadata.state_dict_metadata)} keys"
    if not name.endswith(SUFFIX):  # a file committed with the checkpoint (Lightning's meta.pt)
        return verify_one(path, entry)
    metadata = read_metadata(directory)
    mine = [(index, info) for index, info in (metadata.storage_data or {}).items()
            if plain_name(info.relative_path, path) == name]
    size = os.path.getsize(path)
    whole_ok = None
    if entry is not None:
        whole_ok = range_crcs(path, [(0, size)])[0] == entry.crc32
    tensors, blobs, unsafe = 0, 0, ""
    for index, info in sorted(mine, key=lambda x: x[1].offset):
        if info.offset < 0 or info.length < 0 or info.offset + info.length > size:
            raise CorruptCheckpointError(f"{path}: item {_key(index)} lies at bytes {info.offset}.."
                                         f"{info.offset + info.length} of a {size}-byte file")
        if isinstance(metadata.state_dict_metadata.get(index.fqn), BytesStorageMetadata):
            blobs += 1
            try:  # a torch.save archive too: its structure and pickle (restricted unpickler)
                safe_byte_item(path, info.offset, info.length, index.fqn)
            except CorruptCheckpointError as e:
                raise CorruptCheckpointError(f"{path}: item {_key(index)} is damaged: {e}") from None
            except UnsafeCheckpointError as e:  # intact, but a load refuses it
                unsafe = unsafe or str(e)
            continue
        tensors += 1
        try:
            check_archive(path, read_index(path, info.offset, info.length))
        except CorruptCheckpointError as e:
            raise CorruptCheckpointError(f"{path}: item {_key(index)} is damaged: {e}") from None
    if whole_ok is False:
        raise CorruptCheckpointError(f"{path}: file CRC-32 differs from its commit record (every tensor "
                                     f"item checks: the damage is in a byte item or between items)"
                                     f"{bad_chunk(path, entry)}")
    note = "" if entry is not None else f" (no commit record: the {blobs} byte items' structure checked only)"
    if unsafe:
        note += f"; UNSAFE to load as it is: {unsafe}"
    return f"{path}: {tensors} tensor items, {blobs} byte items, {size} bytes{note}"


def _key(index) -> str:
    offset = f" at {list(index.offset)}" if index.offset is not None and any(index.offset) else ""
    return f"{index.fqn!r}{offset}"
