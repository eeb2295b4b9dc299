"""The uncompressed zip archive torch.save writes, planned before any byte moves.

Owns: placing records (each local header padded through its extra field so the
data starts aligned), the local/central headers with their CRC-32s, ZIP64 where
sizes or offsets pass 4 GiB, and the end record whose comment carries the CRC-32
of every byte before it (so any flipped bit anywhere in the file is caught).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

LOCAL_SIG = 0x04034B50
CENTRAL_SIG = 0x02014B50
EOCD_SIG = 0x06054B50
ZIP64_EOCD_SIG = 0x06064B50
ZIP64_LOCATOR_SIG = 0x07064B50
ZIP64_EXTRA_ID = 0x0001
PAD_EXTRA_ID = 0x4246  # "FB", the id torch's own writer uses for alignment padding
U32_MAX = 0xFFFFFFFF
U16_MAX = 0xFFFF
DOS_DATE = 0x0021  # 1980-01-01: fixed so identical states give identical files
COMMENT_PREFIX = b"fastckpt/1 crc32="


@dataclass
class Record:
    """One zip entry: its name, size and (once planned) where it lives."""

    name: str
    size: int
    align: int = 64
    blob: bytes | None = None  # inline content (metadata records)
    header_off: int = 0
    data_off: int = 0
    crc: int | None = None
    source: object = field(default=None, repr=False)  # what fills it (a storage)

    @property
    def needs_zip64(self) -> bool:
        return self.size >= U32_MAX

    def local_header(self) -> bytes:
        if self.crc is None:
            raise ValueError(f"record {self.name} has no CRC yet")
        name = self.name.encode()
        z64 = struct.pack("<HHQQ", ZIP64_EXTRA_ID, 16, self.size, self.size) if self.needs_zip64 else b""
        fixed = 30 + len(name) + len(z64) + 4
        pad = self.data_off - self.header_off - fixed
        size32 = U32_MAX if self.needs_zip64 else self.size
        head = struct.pack("<IHHHHHIIIHH", LOCAL_SIG, 45 if self.needs_zip64 else 20, 0, 0, 0,
                           DOS_DATE, self.crc, size32, size32, len(name), len(z64) + 4 + pad)
        return head + name + z64 + struct.pack("<HH", PAD_EXTRA_ID, pad) + b"\0" * pad

    def central_header(self) -> bytes:
        name = self.name.encode()
        vals = []
        if self.needs_zip64:
            vals += [self.size, self.size]
        if self.header_off >= U32_MAX:
            vals.append(self.header_off)
        z64 = struct.pack(f"<HH{len(vals)}Q", ZIP64_EXTRA_ID, 8 * len(vals), *vals) if vals else b""
        size32 = U32_MAX if self.needs_zip64 else self.size
        head = struct.pack("<IHHHHHHIIIHHHHHII", CENTRAL_SIG, 45 if vals else 20, 45 if vals else 20,
                           0, 0, 0, DOS_DATE, self.crc, size32, size32, len(name), len(z64), 0, 0, 0,
                           0, min(self.header_off, U32_MAX))
        return head + name + z64


def _local_fixed_len(rec: Record) -> int:
    return 30 + len(rec.name.encode()) + (20 if rec.needs_zip64 else 0) + 4


def place(records: list[Record], start: int = 0) -> int:
    """Assigns header/data offsets to records in order; returns the end offset."""
    cursor = start
    for rec in records:
        rec.header_off = cursor
        base = cursor + _local_fixed_len(rec)
        rec.data_off = -(-base // rec.align) * rec.align
        cursor = rec.data_off + rec.size
    return cursor


def tail_bytes(records: list[Record], cd_offset: int) -> bytes:
    """Central directory + (ZIP64 end records) + end record, without the comment."""
    cd = b"".join(r.central_header() for r in records)
    n = len(records)
    out = cd
    if n >= U16_MAX or len(cd) >= U32_MAX or cd_offset >= U32_MAX:
        z64_off = cd_offset + len(cd)
        out += struct.pack("<IQHHIIQQQQ", ZIP64_EOCD_SIG, 44, 45, 45, 0, 0, n, n, len(cd), cd_offset)
        out += struct.pack("<IIQI", ZIP64_LOCATOR_SIG, 0, z64_off, 1)
        out += struct.pack("<IHHHHIIH", EOCD_SIG, 0, 0, U16_MAX, U16_MAX, U32_MAX, U32_MAX,
                           len(COMMENT_PREFIX) + 8)
    else:
        out += struct.pack("<IHHHHIIH", EOCD_SIG, 0, 0, n, n, len(cd), cd_offset,
                           len(COMMENT_PREFIX) + 8)
    return out


def comment_for(file_crc: int) -> bytes:
    return COMMENT_PREFIX + b"%08x" % file_crc


def tail_size(records: list[Record], cd_offset: int) -> int:
    saved = [r.crc for r in records]
    for r in records:
        r.crc = r.crc or 0
    try:
        return len(tail_bytes(records, cd_offset)) + len(COMMENT_PREFIX) + 8
    finally:
        for r, c in zip(records, saved):
            r.crc = c

