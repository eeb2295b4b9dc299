"""A version's bytes in the pool: the safetensors image of a state, split in two.

The header (8-byte length + JSON: entry names, dtypes, shapes, offsets, per-entry CRCs
and the skeleton of the non-tensor state) goes to the version's metadata extent; the
data section (tensors contiguous in the order the state lists them, entries of 4 KiB and
more 4096-aligned, smaller ones packed) goes to its data extent (LightCheck §III-D).
Joined, the two are byte-for-byte the file format="safetensors" writes, so export is a
copy, and reading goes through that format's one header validator.

Owns MappedWrite (the FileWrite of a pool: copy threads store the live tensors straight
into the data extent, no staging; LightCheck-D / Portus zero-copy on the CPU side) and
read_version (a state back out of the pool, CRCs checked).
"""
from __future__ import annotations

import threading

import torch

from .. import _native
from ..errors import CorruptCheckpointError
from ..format import safetensors_format as st
from ..format.plan import FilePlan
from ..snapshot import JobWrite
from .pool import Pool, Version

READ_THREADS = 4


class MappedWrite(JobWrite):
    """One version in flight into the pool. wait_copied() frees the caller's tensors;
    finish() returns once every byte of the data extent is persistent."""

    def __init__(self, engine, pool: Pool, plan: FilePlan, data_off: int, held: bool = False):
        if plan.format != "safetensors":
            raise ValueError("the pool keeps safetensors images")
        self.plan = plan
        self._copied = threading.Event()
        pieces = [(r.storage.data_ptr(), r.nbytes, r.file_off, i) for i, r in enumerate(plan.records) if r.nbytes]
        self._job = engine.submit_mapped(pool.native, (data_off - plan.data_begin) % (1 << 64), pieces,
                                         plan.data_begin, plan.data_end, len(plan.records), held)

    def finish(self) -> tuple[list[int], list, bytes, int]:
        """(record CRCs, spans, header bytes, image CRC) once the data is persistent."""
        self._job.release_all()
        self._job.wait_written(-1.0)
        self._copied.set()
        crcs = list(self._job.record_crcs())
        blobs, image_crc = self.plan.finish(crcs)
        (off, header), = blobs
        assert off == 0 and len(header) == self.plan.data_begin
        return crcs, [tuple(s) for s in self._job.span_crcs()], header, image_crc

    def abort(self, why: str) -> None:
        self._job.abort(why)


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
