"""The one validator for zip archives (ours and torch.save's).

Owns: finding the end record, reading the central directory and every local
header with bounds checked against the file size *before* anything is
allocated, and refusing what torch's format never contains (compression,
encryption, overlapping records). Produces an index a loader can trust.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from ..errors import CorruptCheckpointError
from . import zip_layout as zl
from .reading import file_bytes

_CRC_HEX = re.compile(rb"[0-9a-f]{8}")

MAX_CD_ENTRIES = 10_000_000


@dataclass(frozen=True)
class Entry:
    name: str  # full name, with the archive's top folder
    header_off: int
    data_off: int
    size: int
    crc: int


@dataclass(frozen=True)
class ZipIndex:
    path: str
    file_size: int
    prefix: str  # "archive/" or the top folder torch picked
    entries: dict[str, Entry]  # keyed by the name below the prefix
    cd_offset: int
    file_crc: int | None  # CRC-32 of bytes [base, comment) if fastckpt wrote the archive
    comment_off: int
    base: int = 0  # where the archive starts in its file

    def ordered(self) -> list[Entry]:
        return sorted(self.entries.values(), key=lambda e: e.header_off)


def _bad(path: str, why: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"{path}: not a valid checkpoint archive ({why})")


class _Bytes:
    """The archive's bytes: [base, base + size) of a file (read_file: reading.file_bytes's read),
    read with every bound checked."""

    def __init__(self, read_file, path: str, base: int, size: int):
        self.read_file, self.path, self.base, self.size = read_file, path, base, size

    def read(self, n: int, off: int) -> bytes:
        if off < 0 or n < 0 or off + n > self.size:
            raise _bad(self.path, f"a field points past the end of the file (offset {off}, length {n})")
        data = self.read_file(self.base + off, n)
        if len(data) != n:
            raise _bad(self.path, "short read: the file changed while being read")
        return data


def _find_eocd(f: _Bytes) -> tuple[int, bytes]:
    path, size = f.path, f.size
    if size < 22:
        raise _bad(path, f"{size} bytes is too small for a zip archive (truncated?)")
    n = min(size, 22 + 0xFFFF)
    tail = f.read(n, size - n)
    for i in range(len(tail) - 22, -1, -1):
        if tail[i:i + 4] == b"PK\x05\x06":
            (clen,) = struct.unpack_from("<H", tail, i + 20)
            if i + 22 + clen == len(tail):
                return size - n + i, tail[i + 22:]
    raise _bad(path, "no end-of-archive record (truncated or not a zip file)")


def _zip64_extra(extra: bytes, want: list[str], path: str) -> dict[str, int]:
    i = 0
    while i + 4 <= len(extra):
        hid, hlen = struct.unpack_from("<HH", extra, i)
        if hid == zl.ZIP64_EXTRA_ID:
            if hlen < 8 * len(want) or i + 4 + hlen > len(extra):
                raise _bad(path, "short ZIP64 extra field")
            vals = struct.unpack_from(f"<{len(want)}Q", extra, i + 4)
            return dict(zip(want, vals))
        i += 4 + hlen
    raise _bad(path, "ZIP64 sizes announced but missing")


def read_index(path: str, base: int = 0, length: int | None = None, at: int | None = None) -> ZipIndex:
    """Parses and cross-checks the archive's structure (not its data). The archive is the
    file's bytes [base, base + length) (by default the whole file: a DCP item's archive lies
    inside a larger file, fastckpt.dcp); offsets in the index are the file's. at: where the
    caller holds the whole file's bytes (a mapping): read there, the file never opened (a child
    forked meanwhile inherits no descriptor of it)."""
    with file_bytes(path, at) as (read, whole):
        size = whole - base if length is None else length
        if base < 0 or size < 0 or base + size > whole:
            raise _bad(path, f"an archive at bytes {base}..{base + size} of a {whole}-byte file")
        idx = _index(_Bytes(read, path, base, size))
    if not base:
        return idx
    entries = {k: Entry(e.name, e.header_off + base, e.data_off + base, e.size, e.crc)
               for k, e in idx.entries.items()}
    return ZipIndex(path, idx.file_size, idx.prefix, entries, idx.cd_offset + base, idx.file_crc,
                    idx.comment_off + base, base)


def _index(f: _Bytes) -> ZipIndex:
    """The index of the archive f, its offsets counted from its start."""
    path, size = f.path, f.size
    eocd_off, comment = _find_eocd(f)
    eocd = f.read(22, eocd_off)
    _, disk, cd_disk, n_here, n, cd_size, cd_off, _ = struct.unpack("<IHHHHIIH", eocd)
    if disk != 0 or cd_disk != 0 or n_here != n:
        raise _bad(path, "multi-disk archives are not supported")
    tail_start = eocd_off
    if n == zl.U16_MAX or cd_size == zl.U32_MAX or cd_off == zl.U32_MAX:
        loc = f.read(20, eocd_off - 20)
        sig, _, z64_off, _ = struct.unpack("<IIQI", loc)
        if sig != zl.ZIP64_LOCATOR_SIG:
            raise _bad(path, "ZIP64 locator missing")
        rec = f.read(56, z64_off)
        (sig, _, _, _, _, _, _, n, cd_size, cd_off) = struct.unpack("<IQHHIIQQQQ", rec)
        if sig != zl.ZIP64_EOCD_SIG:
            raise _bad(path, "ZIP64 end record missing")
        tail_start = z64_off
    if cd_off + cd_size > tail_start or n > MAX_CD_ENTRIES or n * 46 > cd_size:
        raise _bad(path, "central directory does not fit the file")
    cd = f.read(cd_size, cd_off)
    entries: dict[str, Entry] = {}
    prefix = None
    i = 0
    for _ in range(n):
        if i + 46 > len(cd) or struct.unpack_from("<I", cd, i)[0] != zl.CENTRAL_SIG:
            raise _bad(path, "damaged central directory")
        (_, _, _, flags, method, _, _, crc, csize, usize, nlen, elen, clen, _, _, _,
         hoff) = struct.unpack_from("<IHHHHHHIIIHHHHHII", cd, i)
        if i + 46 + nlen + elen + clen > len(cd):
            raise _bad(path, "damaged central directory")
        name = cd[i + 46:i + 46 + nlen].decode("utf-8", "replace")
        extra = cd[i + 46 + nlen:i + 46 + nlen + elen]
        i += 46 + nlen + elen + clen
        if method != 0 or flags & 0x1:
            raise _bad(path, f"record {name!r} is compressed or encrypted")
        want = [k for k, v in (("usize", usize), ("csize", csize), ("hoff", hoff)) if v == zl.U32_MAX]
        z64 = _zip64_extra(extra, want, path) if want else {}
        usize, csize, hoff = z64.get("usize", usize), z64.get("csize", csize), z64.get("hoff", hoff)
        if usize != csize:
            raise _bad(path, f"record {name!r} has inconsistent sizes")
        local = f.read(30, hoff)
        (sig, _, lflags, lmethod, _, _, lcrc, lcs, lus, lnlen, lelen) = struct.unpack("<IHHHHHIIIHH", local)
        lname = f.read(lnlen, hoff + 30).decode("utf-8", "replace")
        if sig != zl.LOCAL_SIG or lname != name or lmethod != 0:
            raise _bad(path, f"local header of record {name!r} does not match the directory")
        if not lflags & 0x8 and (lcrc != crc or (lus != zl.U32_MAX and lus != usize)):
            raise _bad(path, f"local header of record {name!r} disagrees with the directory")
        data_off = hoff + 30 + lnlen + lelen
        if data_off + usize > cd_off:
            raise _bad(path, f"record {name!r} runs into the central directory")
        top, sep, rest = name.partition("/")
        if not sep:
            raise _bad(path, f"record {name!r} is outside a top folder")
        prefix = prefix or top + "/"
        if top + "/" != prefix:
            raise _bad(path, "records under more than one top folder")
        if rest in entries:
            raise _bad(path, f"record {name!r} appears twice")
        entries[rest] = Entry(name, hoff, data_off, usize, crc)
    spans = sorted((e.header_off, e.data_off + e.size) for e in entries.values())
    for (_, end), (start, _) in zip(spans, spans[1:]):
        if start < end:
            raise _bad(path, "records overlap")
    file_crc = None
    if comment.startswith(zl.COMMENT_PREFIX):
        digits = comment[len(zl.COMMENT_PREFIX):]
        # Exactly what the writer emits (8 lowercase hex digits): int(x, 16) would also take
        # 'C' for 'c', so a flipped case bit in the recorded CRC would go unnoticed.
        if not _CRC_HEX.fullmatch(digits):
            raise _bad(path, "damaged fastckpt comment")
        file_crc = int(digits, 16)
    elif comment:
        raise _bad(path, "unrecognised archive comment (damaged end record?)")
    return ZipIndex(path, size, prefix or "archive/", entries, cd_off, file_crc,
                    size - len(comment))
