"""One committed part copied from one tier to the next (a file, or an object: `upload_part`): checked against its record before a
byte is written (as one archive, or as a DCP rank file of many by its whole-file CRC-32: a damaged
memory copy never reaches the disk), then written durably
(O_DIRECT where the filesystem allows, fdatasync'ed) from a mapping of the source: its bytes are
checked and written where they lie in memory (the disk reads them straight from the mapping), no
copy of them is made. A part this process just wrote into a memory tier is read through the
mapping its save left held (the native memory_maps.h), without mapping it again, and without
opening it: its index and structure are read there too (verify_file's `at`), so a process forked
meanwhile (a DataLoader's worker) inherits no descriptor that would keep the part's memory.
"""
from __future__ import annotations

import errno
import mmap
import os

import numpy as np

from .. import _native
from ..commit_info import FileEntry
from ..errors import CheckpointWriteError, CorruptCheckpointError
from ..verify import verify_as_recorded, verify_file


def checked_size(src: str, entry: FileEntry) -> int:
    """src's size, when it is the one its record's entry says (CorruptCheckpointError naming src otherwise)."""
    size = os.path.getsize(src)
    if size != entry.bytes:
        raise CorruptCheckpointError(f"{src}: has {size} bytes, the commit record says {entry.bytes}")
    return size


def upload_part(bucket, key: str, src: str, entry: FileEntry, part_bytes: int, concurrency: int) -> str:
    """src's bytes, which its record's entry describes, uploaded as the object key of bucket (an
    object store's client: fastckpt.store.s3.client.Bucket), checked against the entry on the
    mapping the upload sends from before a byte is sent; the object's ETag. A failed upload is
    aborted (no parts left to bill) and raised as CheckpointWriteError."""
    if checked_size(src, entry) == 0:
        verify_file(src, entry)
    try:
        return bucket.put_file(key, src, part_bytes, concurrency,
                               check=lambda at: verify_as_recorded(src, entry, at=at)) or ""
    except OSError as e:  # aborted by the client
        raise CheckpointWriteError(str(e)) from e


def copy_part(src: str, dst: str, entry: FileEntry, direct_io: bool = True) -> None:
    """src's bytes, which its record's entry describes, made durable at dst (fsync of dst's
    folder is the commit's). CorruptCheckpointError names src when it does not verify."""
    size = checked_size(src, entry)
    if size == 0:
        verify_file(src, entry)
        open(dst, "wb").close()
        return
    held = _native.find_memory_map(src, size)  # the mapping its save left held (memory_maps.h)
    if held:
        try:
            verify_as_recorded(src, entry, at=held)
            write_durably(dst, held, size, direct_io)
        finally:
            _native.give_back_memory_map(held)
        return
    with open(src, "rb") as f:  # one mapping, its pages faulted in at once: checked, then written from
        mapping = mmap.mmap(f.fileno(), size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                            prot=mmap.PROT_READ)
    try:
        view = np.frombuffer(mapping, dtype=np.uint8)
        at = view.ctypes.data
        verify_as_recorded(src, entry, at=at)
        write_durably(dst, at, size, direct_io)
    finally:
        del view
        mapping.close()


def write_durably(dst: str, at: int, size: int, direct_io: bool) -> None:
    """size bytes at address `at` as the whole file dst (a longer file a dead writer left there is
    cut), fdatasync'ed; O_DIRECT where its filesystem takes it (from a page-aligned `at`, the disk
    reads them where they lie)."""
    if direct_io:
        try:
            _native.write_direct(dst, 0, at, size, True)
            return
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            if os.path.exists(dst):
                os.unlink(dst)
    _native.write_buffered(dst, 0, at, size, False)
    os.truncate(dst, size)
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)
