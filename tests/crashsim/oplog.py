"""The log record_shim.c writes: one Op per file operation under the recorded root, in the order
of the one sequence every recorded process numbers its ops from.

    ops = read_log(path)      # list[Op]; UnsupportedLog when the log holds a call not modelled
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

HEAD = struct.Struct("<I B 3x Q q q Q Q i I I I")
MAGIC = 0x52534346
KINDS = {1: "open", 2: "write", 3: "truncate", 4: "fsync", 5: "rename", 6: "unlink", 7: "mkdir", 8: "rmdir",
         9: "mark", 10: "page", 11: "unsupported"}
CREATED = 1 << 30  # flags of an open that created its file


class UnsupportedLog(Exception):
    """The recording holds a call the simulator does not model: judging it would be guessing."""


@dataclass
class Op:
    seq: int
    kind: str
    ino: int  # the inode it touched (a rename: the renamed one)
    ino2: int  # rename: the inode it replaced (-1: none); page: the op before the stores it holds
    off: int  # write/page/fsync of a range: offset; truncate: the size it left
    length: int
    flags: int  # open: its flags (CREATED); fsync: 1 fdatasync, 2 a range (msync); truncate: 1 fallocate
    path: str
    path2: str
    data: bytes

    @property
    def created(self) -> bool:
        return self.kind == "open" and bool(self.flags & CREATED)


def read_log(path: str) -> list[Op]:
    with open(path, "rb") as f:
        raw = f.read()
    ops, at = [], 0
    while at < len(raw):
        magic, kind, seq, ino, ino2, off, length, flags, pl, p2l, dl = HEAD.unpack_from(raw, at)
        if magic != MAGIC:
            raise ValueError(f"{path}: record at byte {at} has no magic (a torn log)")
        at += HEAD.size
        p = raw[at:at + pl].decode(errors="surrogateescape")
        at += pl
        p2 = raw[at:at + p2l].decode(errors="surrogateescape")
        at += p2l
        data = raw[at:at + dl]
        at += dl
        op = Op(seq, KINDS[kind], ino, ino2, off, length, flags, p, p2, bytes(data))
        if op.kind == "unsupported":
            raise UnsupportedLog(f"{op.path}: {op.path2} (seq {seq}) is not modelled by the simulator")
        ops.append(op)
    ops.sort(key=lambda o: o.seq)  # several processes append to one log; their numbers are one sequence
    for a, b in zip(ops, ops[1:]):
        if b.seq != a.seq + 1:
            raise ValueError(f"{path}: no op numbered between {a.seq} and {b.seq} (a record lost)")
    return ops
