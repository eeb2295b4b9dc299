"""Creation of the native engines (fastckpt._native.Engine: staging pool + copy/writer
threads) and their sizing (by the machine's facts: fastckpt.machine)."""
from __future__ import annotations

from .. import _native
from ..machine import hardware_threads

MiB = 1 << 20


def new_engine(chunk_mb: int, writers: int, copy_threads: int | None = None) -> "_native.Engine":
    chunk = int(chunk_mb * MiB) // 4096 * 4096
    if chunk <= 0:
        raise ValueError(f"chunk_mb={chunk_mb} is too small (need at least 4 KiB)")
    return _native.Engine(chunk, copy_threads or min(4, hardware_threads()), max(1, writers))


_default = None


def default_engine() -> "_native.Engine":
    """The engine behind the one-file fastckpt.save(): 64 MiB chunks, 4 writers, 4 chunks."""
    global _default
    if _default is None:
        _default = new_engine(64, 4)
        _default.pool.grow(4)
    return _default
