"""Small filesystem helpers: fsync a directory, make directories durable by name, write a file
atomically, read a small file that must be a regular one (a FIFO or device planted under a
checkpoint's name must not hang or feed a reader).

A name (a file or directory made or renamed) survives a power loss only once its directory
is fsync'ed after it: POSIX orders no two of them, so a record may land without the files it
names unless their directory was fsync'ed first (tests/crashsim replays such losses)."""
from __future__ import annotations

import os
import stat
import threading


def read_regular(path: str, limit: int) -> bytes:
    """Up to `limit` bytes of path; OSError for a FIFO, device or socket (opened without blocking)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        check_regular(fd, path)
        chunks, left = [], limit
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


def check_regular(fd: int, path: str) -> None:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise OSError(f"{path} is not a regular file (a FIFO, device or socket?); refusing to read it")


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def makedirs_durable(path: str) -> None:
    """os.makedirs(path, exist_ok=True), and every directory it made durable by name (its
    parent fsync'ed once it exists)."""
    path = os.path.abspath(path)
    made, p = [], path
    while not os.path.isdir(p) and os.path.dirname(p) != p:
        made.append(p)
        p = os.path.dirname(p)
    os.makedirs(path, exist_ok=True)
    for d in reversed(made):
        fsync_dir(os.path.dirname(d))


def write_atomic(path: str, data: bytes) -> None:
    """tmp + fsync + rename + directory fsync: path holds old or new bytes, durably. The tmp name
    is this thread's own (two threads writing one path never share it)."""
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_native_id()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))
