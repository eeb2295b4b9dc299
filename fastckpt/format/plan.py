"""A file planned before any byte moves: what goes where, and how to finish it.

Owns the contract between a format (torch zip, safetensors) and the writer:
the storage pieces (memory -> file offset, one record each), the extent they
cover, the file size, and a finisher that, given each record's CRC-32, returns
the remaining bytes (headers, directory) to write and the file's own CRC.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

ALIGN = 4096


@dataclass
class DataRecord:
    """One storage's bytes in the file."""

    name: str
    file_off: int
    nbytes: int
    storage: torch.UntypedStorage = field(repr=False)


@dataclass
class FilePlan:
    format: str
    records: list[DataRecord]
    data_begin: int
    data_end: int
    file_size: int
    # finish(record_crcs) -> (blobs [(offset, bytes)], file_crc)
    finish: Callable[[list[int]], tuple[list[tuple[int, bytes]], int]] = field(repr=False)

    def devices(self) -> set[str]:
        return {r.storage.device.type for r in self.records}

