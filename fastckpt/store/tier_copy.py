"""One committed part copied from one tier to the next: checked against its record before a
byte is written (a damaged memory copy never reaches the disk), then written durably
(O_DIRECT where the filesystem allows, fdatasync'ed) from a mapping of the source: no copy of
the training state is taken for it.
"""
from __future__ import annotations

import errno
import os

import torch

from .. import _native
from ..commit_info import FileEntry
from ..errors import CorruptCheckpointError
from ..verify import verify_file


def copy_part(src: str, dst: str, entry: FileEntry, direct_io: bool = True) -> None:
    """src's bytes, which its record's entry describes, made durable at dst (fsync of dst's
    folder is the commit's). CorruptCheckpointError names src when it does not verify."""
    size = os.path.getsize(src)
    if size != entry.bytes:
        raise CorruptCheckpointError(f"{src}: has {size} bytes, the commit record says {entry.bytes}")
    verify_file(src, entry)
    if size == 0:
        open(dst, "wb").close()
        return
    source = torch.UntypedStorage.from_file(src, False, size)
    if direct_io:
        try:
            _native.write_direct(dst, 0, source.data_ptr(), size, True)
            return
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            os.unlink(dst) if os.path.exists(dst) else None
    _native.write_buffered(dst, 0, source.data_ptr(), size, True)
