"""A version's bytes in the pool: the safetensors image of a state, split in two.

The header (8-byte length + JSON: entry names, dtypes, shapes, offsets, per-entry CRCs
and the skeleton of the non-tensor state) goes to the version's metadata extent; the
data section (tensors contiguous in the order the state lists them, entries of 4 KiB and
more 4096-aligned, smaller ones packed) goes to its data extent (LightCheck §III-D).
Joined, the two are byte-for-byte the file format="safetensors" writes, so export is a
copy, and reading goes through that format's one header validator.

Owns read_version (a state back out of the pool, CRCs checked) and image_bytes (the
version as a safetensors file's bytes). Writing a version is the write path's
(fastckpt.write: host_mapped.py, device_mapped.py).
"""
from __future__ import annotations

import torch

from .. import _native
from ..errors import CorruptCheckpointError
from ..format import safetensors_format as st
from .pool import Pool, Version

READ_THREADS = 4


def read_version(pool: Pool, v: Version, map_location=None, verify: bool = True,
                 weights_only: bool = True):
    """The state a sealed version holds, copied out of the pool (the pool's bytes may be
    reused by a later save), every entry's CRC and the header's checked when verify."""
    where = f"{pool.path}#{v.model}@{v.counter}"
    d = v.desc
    head = pool.read_at(d.meta_off, d.meta_len)
    if d.data_len > d.data_cap or d.meta_len > d.meta_cap or d.data_off + d.data_len > pool.size:
        raise CorruptCheckpointError(f"{where}: its descriptor's lengths exceed its extents or the pool")
    header, data_begin, head = st.parse_header(head, d.meta_len + d.data_len, where)
    if data_begin != d.meta_len:
        raise CorruptCheckpointError(f"{where}: header length disagrees with its descriptor")
    names, spans = st.entry_spans(header)
    bufs = [torch.empty(n, dtype=torch.uint8) for _, n in spans]
    for buf, (off, n) in zip(bufs, spans):
        if off + n > d.data_len:
            raise CorruptCheckpointError(f"{where}: entry past the end of its data")
        if n:
            _native.copy(buf.data_ptr(), pool.address(d.data_off + off), n, READ_THREADS)
    crcs = None
    if verify:
        crcs = _native.crc_ranges([(b.data_ptr(), b.numel()) for b in bufs], READ_THREADS, 64 << 20)
    _check_unchanged(pool, v, where)
    return st.assemble(where, header, head, names, bufs, crcs, verify, map_location, weights_only,
                       d.image_crc if verify else None)


def image_bytes(pool: Pool, v: Version):
    """The version's image as (header bytes, a memoryview of the data): a safetensors file."""
    d = v.desc
    return pool.read_at(d.meta_off, d.meta_len), pool.view[d.data_off:d.data_off + d.data_len]


def _check_unchanged(pool: Pool, v: Version, where: str) -> None:
    """A writer may reuse an older version's slot while it is read: the slot must still
    hold the same sealed version after the copy, or what was copied is not that version."""
    desc, sealed = pool.slot(v.entry, v.slot)
    if not sealed or desc.counter != v.counter:
        raise CorruptCheckpointError(f"{where} was overwritten by a newer save while it was read")
