"""The pool's on-media layout: superblock, model table, version slots (Portus §III-D).

    [0, 4 KiB)            superblock: magic, layout version, pool size, where the table
                          and the heap start, its own CRC-32
    [4 KiB, heap)         model table: MAX_MODELS entries of 1 KiB, each
                            used word (8 B, atomic)   active word (8 B, atomic)
                            name (length, CRC, bytes) and SLOTS version slots of 96 B
    [heap, size)          extents (4 KiB-aligned) holding each version's metadata
                          (the safetensors header + a JSON of the saver's meta) apart from
                          its tensor data

A slot is valid when its counter word is non-zero and its descriptor CRC matches; the
counter word is stored last (one aligned 8-byte store, persisted), so a slot is either
sealed with everything it describes durable, or not valid at all. The active word
(counter << 8 | slot) says which sealed slot is the model's current version; it too is
one aligned 8-byte store, so flipping it is atomic. This module only encodes and decodes.
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

MAGIC = b"FCKPOOL1"
LAYOUT_VERSION = 1
TABLE_OFF = 4096
MAX_MODELS = 256
ENTRY_BYTES = 1024
SLOTS = 8
SLOT_BYTES = 96
SLOTS_OFF = 256  # inside an entry
NAME_MAX = 200
USED = 0x4C45444F4D4B4346  # b"FCKMODEL" little-endian
ALIGN = 4096
HEAP_OFF = 2 << 20  # after the table (256 KiB), rounded to a huge page
MIN_POOL = HEAP_OFF + (2 << 20)

_SUPER = struct.Struct("<8sIIQQIIQ")  # magic, version, 0, size, table, models, slots, heap
_SLOT = struct.Struct("<QQQQQQQQdIHHIII")  # 92 bytes, then their CRC-32: SLOT_BYTES
assert _SLOT.size + 4 == SLOT_BYTES


def encode_super(size: int) -> bytes:
    body = _SUPER.pack(MAGIC, LAYOUT_VERSION, 0, size, TABLE_OFF, MAX_MODELS, SLOTS, HEAP_OFF)
    return body + struct.pack("<I", zlib.crc32(body))


def decode_super(raw: bytes) -> dict:
    """The superblock's fields; ValueError saying what is wrong with it."""
    body = raw[:_SUPER.size]
    if body[:8] != MAGIC:
        raise ValueError("not a fastckpt pool (bad magic)")
    (crc,) = struct.unpack_from("<I", raw, _SUPER.size)
    if zlib.crc32(body) != crc:
        raise ValueError("the pool's superblock is damaged (CRC mismatch)")
    magic, version, _, size, table, models, slots, heap = _SUPER.unpack(body)
    if version != LAYOUT_VERSION:
        raise ValueError(f"pool layout version {version} is not supported (this build reads {LAYOUT_VERSION})")
    if (table, models, slots, heap) != (TABLE_OFF, MAX_MODELS, SLOTS, HEAP_OFF):
        raise ValueError("the pool's superblock describes a table this build does not know")
    return {"size": size}


def entry_off(i: int) -> int:
    return TABLE_OFF + i * ENTRY_BYTES


def slot_off(i: int, s: int) -> int:
    return entry_off(i) + SLOTS_OFF + s * SLOT_BYTES


def encode_name(name: str) -> bytes:
    raw = name.encode()
    if not raw or len(raw) > NAME_MAX:
        raise ValueError(f"model names are 1..{NAME_MAX} bytes of UTF-8, got {name!r}")
    return struct.pack("<II", len(raw), zlib.crc32(raw)) + raw


def decode_name(raw: bytes) -> str | None:
    n, crc = struct.unpack_from("<II", raw, 0)
    if not 0 < n <= NAME_MAX or zlib.crc32(raw[8:8 + n]) != crc:
        return None
    return raw[8:8 + n].decode(errors="replace")


def pack_active(counter: int, slot: int) -> int:
    return (counter << 8) | slot


def unpack_active(word: int) -> tuple[int, int] | None:
    if word == 0 or (word & 0xFF) >= SLOTS:
        return None
    return word >> 8, word & 0xFF


@dataclass
class Slot:
    """One version slot's descriptor. counter == 0: not sealed (free, claimed or torn)."""

    counter: int = 0
    step: int = 0
    meta_off: int = 0
    meta_cap: int = 0
    meta_len: int = 0  # bytes of the safetensors header (8-byte length + JSON)
    data_off: int = 0
    data_cap: int = 0
    data_len: int = 0
    time: float = 0.0
    image_crc: int = 0  # CRC-32 of header + data: the crc a file of the same bytes has
    rank: int = 0
    world_size: int = 1
    extra_len: int = 0  # the saver's JSON, after the header in the meta extent
    extra_crc: int = 0
    flags: int = 0

    def body(self) -> bytes:
        return _SLOT.pack(self.counter, self.step, self.meta_off, self.meta_cap, self.meta_len,
                          self.data_off, self.data_cap, self.data_len, self.time, self.image_crc,
                          self.rank, self.world_size, self.extra_len, self.extra_crc, self.flags)

    def encode(self) -> bytes:
        body = self.body()
        return body + struct.pack("<I", zlib.crc32(body))

    @classmethod
    def decode(cls, raw: bytes) -> tuple["Slot", bool]:
        """(slot, sealed): sealed when the counter is set and the descriptor CRC matches."""
        slot = cls(*_SLOT.unpack_from(raw, 0))
        (crc,) = struct.unpack_from("<I", raw, _SLOT.size)
        return slot, slot.counter != 0 and zlib.crc32(bytes(raw[:_SLOT.size])) == crc

    def extents(self) -> list[tuple[int, int]]:
        return [(o, c) for o, c in ((self.meta_off, self.meta_cap), (self.data_off, self.data_cap)) if c]


def round_up(n: int, a: int = ALIGN) -> int:
    return -(-n // a) * a
