"""One rank's DCP write items laid out in one file, planned before a byte moves.

DCP hands a StorageWriter its write items, each resolved to a tensor (a whole tensor or a
shard) or to bytes (any other value, pickled by DCP's planner). Here each tensor item becomes
a torch.save archive of its own, starting 4096-aligned with its data record 4096-aligned —
what DCP's stock FileSystemReader reads back (torch.load of the item's byte range) — and each
byte item is its bytes, as DCP's FileSystemWriter writes them. Byte items come first, then the
tensor archives, largest first; the gaps before an archive are zeros. Everything is one
FilePlan, so the write path copies and writes every tensor of the file in parallel (O_DIRECT,
CRC-32 per chunk) and each archive carries the zip CRC-32 of its data record: the per-item CRC
FastStorageReader checks.
"""
from __future__ import annotations

import io
import zlib
from dataclasses import dataclass

import torch

from .. import _native
from ..format.plan import ALIGN, DataRecord, FilePlan
from ..format.torch_format import plan_torch
from ..format.zip_layout import comment_for

COMMENT_LEN = len(comment_for(0))


@dataclass(frozen=True)
class Placed:
    """Where one item lies in the file: its bytes are [offset, offset + length)."""

    offset: int
    length: int


def own_storage(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor as a storage of its own: torch.save writes a view's whole storage (a shard of a
    flat buffer would carry the buffer), so a view that does not cover its storage is copied."""
    t = tensor.detach()
    if t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.nbytes:
        return t
    return t.contiguous().clone()


def _up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def plan_items(values: list) -> tuple[FilePlan, list[Placed]]:
    """values: each a torch.Tensor or bytes (bytes-like, io.BytesIO). Returns the file's plan and
    where each value lies, in the order given."""
    places: list[Placed | None] = [None] * len(values)
    parts: list[tuple[int, object]] = []  # (offset, bytes | FilePlan), in file order
    cursor = 0
    order = sorted(range(len(values)), key=lambda i: (isinstance(values[i], torch.Tensor),
                                                      -_size(values[i])))
    for i in order:
        v = values[i]
        if isinstance(v, torch.Tensor):
            cursor = _up(cursor)
            sub = plan_torch(own_storage(v))
            parts.append((cursor, sub))
            places[i] = Placed(cursor, sub.file_size)
            cursor += sub.file_size
        else:
            blob = v.getvalue() if isinstance(v, io.BytesIO) else bytes(v)
            parts.append((cursor, blob))
            places[i] = Placed(cursor, len(blob))
            cursor += len(blob)
    subs = [(off, p) for off, p in parts if isinstance(p, FilePlan)]
    records = [DataRecord(f"{n}/{r.name}", off + r.file_off, r.nbytes, r.storage)
               for n, (off, p) in enumerate(subs) for r in p.records]
    if subs:
        begin, end = subs[0][0] + subs[0][1].data_begin, subs[-1][0] + subs[-1][1].data_end
    else:
        begin = end = cursor - cursor % ALIGN  # no tensor: an empty extent, everything written as blobs

    def finish(crcs: list[int]) -> tuple[list[tuple[int, bytes]], int]:
        blobs: list[tuple[int, bytes]] = []
        file_crc, at, taken = 0, 0, 0
        for off, part in parts:
            if off > at:  # the zeros before an aligned archive
                blobs.append((at, bytes(off - at)))
                file_crc = zlib.crc32(bytes(off - at), file_crc)
            if isinstance(part, FilePlan):
                n = len(part.records)
                sub_blobs, sub_crc = part.finish(crcs[taken:taken + n])
                taken += n
                blobs += [(off + o, b) for o, b in sub_blobs]
                # the archive's own CRC stops where its comment (which holds that CRC) begins
                comment = sub_blobs[-1][1][-COMMENT_LEN:]
                file_crc = _native.crc32_concat(file_crc, sub_crc, part.file_size - COMMENT_LEN)
                file_crc = zlib.crc32(comment, file_crc)
                at = off + part.file_size
            else:
                if part:
                    blobs.append((off, part))
                file_crc = zlib.crc32(part, file_crc)
                at = off + len(part)
        return blobs, file_crc

    return FilePlan("torch", records, begin, end, cursor, finish), places  # file CRC: the whole file's


def _size(v) -> int:
    if isinstance(v, torch.Tensor):
        return v.nbytes
    return v.getbuffer().nbytes if isinstance(v, io.BytesIO) else len(v)
