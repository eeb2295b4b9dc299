"""What callers see of a committed checkpoint: CommitInfo (its step, folder, size, counter, time,
world size, format and files) and FileEntry (one file of it: name, rank, bytes, CRC-32, spans).

Plain values, below everything that makes, writes or reads one (fastckpt.commit.record encodes
them; a Pending settles to one), so a layer low in the house can hand one on. CommitInfo is built
by keyword only.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from .errors import CorruptCheckpointError


@dataclass(frozen=True)
class FileEntry:
    name: str  # relative to the checkpoint directory
    rank: int
    bytes: int
    crc32: int
    spans: list = field(default_factory=list, compare=False)  # [record, offset, length, crc]
    records: list = field(default_factory=list, compare=False)  # record names, by index
    etag: str = field(default="", compare=False)  # the object's ETag, in an object store ("": a file)


@dataclass(frozen=True, kw_only=True)
class CommitInfo:
    """A committed checkpoint: its step, directory, size and when it was written."""

    step: int
    path: str
    bytes: int
    counter: int
    time: float
    world_size: int
    format: str
    files: tuple[FileEntry, ...] = ()
    meta: dict = field(default_factory=dict, compare=False)

    def __repr__(self) -> str:  # the record's spans and CRCs are for verify, not for reading
        return (f"CommitInfo(step={self.step}, path={self.path!r}, bytes={self.bytes}, counter={self.counter}, "
                f"world_size={self.world_size}, format={self.format!r}, files={len(self.files)})")

    def file_for(self, rank: int) -> str:
        for f in self.files:
            if f.rank == rank:
                return os.path.join(self.path, f.name)
        raise CorruptCheckpointError(f"checkpoint {self.path} has no file for rank {rank}")

    def entry_for(self, rank: int) -> FileEntry:
        for f in self.files:
            if f.rank == rank:
                return f
        raise CorruptCheckpointError(f"checkpoint {self.path} has no file for rank {rank}")
