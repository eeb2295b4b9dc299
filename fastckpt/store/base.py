"""What every store does the same way unless it says otherwise.

A store decides where a checkpoint's bytes go and how one becomes committed; the
Checkpointer drives it (see FileStore for the whole protocol). File-backed stores write
files planned in the Checkpointer's format through the native file writer and read
them back with the format readers; the pmem store overrides these hooks.
"""
from __future__ import annotations

from ..format import load_file
from ..snapshot import start_write


class Store:
    layout_format: str | None = None  # None: the Checkpointer's own format
    stages = True  # strategy "c" copies through the engine's staging pool
    allow_pickle = False  # safetensors layouts: non-JSON values are an error

    def start_write(self, engine, plan, file_path: str, strategy: str, direct_io: bool, held: bool = False):
        return start_write(engine, plan, file_path, strategy, direct_io, held)

    def finish_write(self, write, file_path: str):
        return write.finish()

    def commit_rank(self, ckpt_id: str, info) -> None:
        """Every rank, after all ranks' parts are durable and before rank 0's commit()."""

    def load(self, info, rank: int, map_location=None, verify: bool = True, weights_only: bool = True,
             mmap=None):
        return load_file(info.file_for(rank), map_location, verify, weights_only,
                         expect_crc=info.entry_for(rank).crc32 if verify else None, mmap=mmap)
