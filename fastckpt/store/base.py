"""What every store does the same way unless it says otherwise.

A store decides where a checkpoint's bytes go and how one becomes committed; the
Checkpointer drives it (see RootStore for the whole protocol). File-backed stores write
files planned in the Checkpointer's format through the native file writer and read
them back with the format readers; the pmem store overrides these hooks.
"""
from __future__ import annotations

import os

from ..format import load_file
from ..verify import verify_file
from ..write.protocol import FileSink


class Store:
    layout_format: str | None = None  # None: the Checkpointer's own format
    sink_kind = "file"  # what sink() returns: write.select picks the write implementation by it
    allow_pickle = False  # safetensors layouts: non-JSON values are an error

    def sink(self, file_path: str, direct_io: bool):
        """Where the write of the checkpoint begun as `file_path` puts its bytes."""
        return FileSink(file_path, direct_io)

    def finish_write(self, write, file_path: str):
        """The commit thread's step 3 of the write protocol: a WriteResult once durable."""
        return write.finish()

    def commit_rank(self, ckpt_id: str, info) -> None:
        """Every rank, after all ranks' parts are durable and before rank 0's commit()."""

    def verify(self, info) -> None:
        """Reads every byte of a committed checkpoint (all ranks) and checks its CRC-32s against
        the record; CorruptCheckpointError (or OSError) names what is wrong."""
        for f in info.files:
            verify_file(os.path.join(info.path, f.name), f)

    def load(self, info, rank: int, map_location=None, verify: bool = True, weights_only: bool = True,
             mmap=None):
        return load_file(info.file_for(rank), map_location, verify, weights_only,
                         expect_crc=info.entry_for(rank).crc32 if verify else None, mmap=mmap)
