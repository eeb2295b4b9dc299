"""Whether a claimed, unsealed version slot still has a writer: a lock its writer holds.

A version is written into a slot that is claimed (room taken, counter 0) and sealed once
its bytes are persistent. A writer killed in between leaves the slot claimed for ever: a
torn version whose room nothing would reuse until its model is dropped. So while a writer
works on a slot it holds an open-file-description lock (F_OFD_SETLK) on that slot's first
byte of the pool. The kernel releases it when the writer closes it — at seal or abort — or
dies, kill -9 included; and unlike POSIX record locks, OFD locks conflict between two opens
in the same process too, so a repack run beside a writer in one process sees it. A slot
whose lock can be taken has no writer: repack may reclaim its room.
"""
from __future__ import annotations

import errno
import fcntl
import os
import struct

_FLOCK = "hhqqixxxx"  # struct flock on Linux (x86_64, aarch64): type, whence, start, len, pid


def _lock(fd: int, off: int, kind: int) -> bool:
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(_FLOCK, kind, os.SEEK_SET, off, 1, 0))
        return True
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


def hold(path: str, off: int) -> int | None:
    """The writer's side: a new open of the pool locking byte `off`; None when another writer holds it."""
    fd = os.open(path, os.O_RDWR)
    if _lock(fd, off, fcntl.F_WRLCK):
        return fd
    os.close(fd)
    return None


def let_go(fd: int) -> None:
    os.close(fd)  # closing the open file description drops its lock


def abandoned(fd: int, off: int) -> bool:
    """Whether no writer holds byte `off` (probed through `fd`, an open of the pool of its own)."""
    if not _lock(fd, off, fcntl.F_WRLCK):
        return False
    _lock(fd, off, fcntl.F_UNLCK)
    return True
