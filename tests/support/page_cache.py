"""How much of a file is in the page cache, read with mincore(2): a file written through
O_DIRECT leaves (almost) none of its data there, a buffered write leaves all of it; a file's pages
dropped from it; and whether a folder is on a filesystem that holds every page in memory."""
from __future__ import annotations

import ctypes
import importlib.util
import mmap
import os
import subprocess

from support.paths import BENCHMARKS

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident_fraction(path: str) -> float:
    """The share of the file's pages that are in the page cache now (0.0 to 1.0)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            return sum(v & 1 for v in vec) / pages
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def drop_cache(path: str) -> None:
    """Evicts a file's pages from the page cache: the benchmarks' own (benchmarks/helpers/bounds.py,
    loaded by its path: the benchmarks are no package of the tests)."""
    spec = importlib.util.spec_from_file_location("bounds", os.path.join(BENCHMARKS, "helpers", "bounds.py"))
    bounds = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bounds)
    bounds.drop_cache(path)


def memory_filesystem(path) -> str | None:
    """The kind of filesystem `path` is on where that keeps every page in memory whatever the
    write (tmpfs, ramfs: before Linux 6.6 it also refuses O_DIRECT), else None."""
    kind = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True).stdout.strip()
    return kind if kind in ("tmpfs", "ramfs") else None
