"""Physical bounds measured in the same run as the peers: memcpy, O_DIRECT write and read.

The O_DIRECT writer and reader move their blocks from and to the best memory a plain program can
have: private mappings aligned to 2 MiB and advised for huge pages before the first touch, as
fastckpt's own staging is (native/include/fastckpt/io_memory.h). A request the block layer builds
carries at most max_segments physically contiguous runs, so on a disk that pays per request the
source's pages set the speed: scattered 4 KiB pages made the same 1 GiB write 1.6x slower on this
project's virtio disk. A bound from such pages would be no bound."""
from __future__ import annotations

import ctypes
import mmap
import os
import threading
import time

import torch

BLOCK = 64 << 20
HUGE_PAGE = 2 << 20


def io_buffer(n: int) -> tuple[mmap.mmap, memoryview]:
    """n bytes of private memory, 2 MiB-aligned and advised for huge pages before the first touch
    (keep the mapping, the first item, alive as long as the view)."""
    m = mmap.mmap(-1, n + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    skip = -ctypes.addressof(ctypes.c_char.from_buffer(m)) % HUGE_PAGE
    if hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)
    return m, memoryview(m)[skip:skip + n]


def memcpy_seconds(state: dict[str, torch.Tensor]) -> float:
    dst = {k: torch.empty_like(v) for k, v in state.items()}
    for v in dst.values():
        v.fill_(0)  # fault the pages in: we time the copy, not the allocation
    t0 = time.perf_counter()
    for k, v in state.items():
        dst[k].copy_(v)
    return time.perf_counter() - t0


def drop_cache(path: str) -> None:
    """Evicts a file's pages (clean pages go without root: fdatasync first)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cache_file(path: str) -> None:
    """Brings a whole file into the page cache (buffered reads), for a load measured warm: a cold
    load that reads around the cache (fastckpt's O_DIRECT loads) leaves nothing there behind it."""
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(16 << 20)
        while f.readinto(buf):
            pass


def drop_folder(path: str) -> None:
    """drop_cache of every file of a folder (a DCP checkpoint) or of one file."""
    if not os.path.isdir(path):
        return drop_cache(path)
    for name in os.listdir(path):
        if os.path.isfile(os.path.join(path, name)):
            drop_cache(os.path.join(path, name))


def _direct_io(path: str, nbytes: int, threads: int, write: bool) -> float:
    pattern = os.urandom(1 << 20) * (BLOCK >> 20)
    flags = (os.O_WRONLY | os.O_CREAT) if write else os.O_RDONLY
    fd = os.open(path, flags | os.O_DIRECT, 0o644)
    if write:
        os.posix_fallocate(fd, 0, nbytes)
    blocks = list(range(0, nbytes, BLOCK))
    lock = threading.Lock()
    kept, views = [], []
    for _ in range(threads):  # buffers ready and faulted in before the clock starts
        mapping, view = io_buffer(BLOCK)
        view[:] = pattern
        kept.append(mapping)
        views.append(view)
    start = threading.Barrier(threads + 1)

    def work(local):
        start.wait()
        while True:
            with lock:
                if not blocks:
                    return
                off = blocks.pop(0)
            n = -(-min(BLOCK, nbytes - off) // 4096) * 4096
            if write:
                os.pwritev(fd, [local[:n]], off)
            else:
                os.preadv(fd, [local[:n]], off)

    ts = [threading.Thread(target=work, args=(v,)) for v in views]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    if write:
        os.fdatasync(fd)
    dt = time.perf_counter() - t0
    os.close(fd)
    return dt


WRITE_THREADS = (1, 4)


def direct_write_each(path: str, nbytes: int) -> dict[int, float]:
    """Seconds of a plain O_DIRECT writer with 1 and with 4 threads (64 MiB blocks, fdatasync)."""
    each = {}
    for threads in WRITE_THREADS:
        if os.path.exists(path):
            os.unlink(path)
        each[threads] = _direct_io(path, nbytes, threads, True)
    return each


def direct_write_seconds(path: str, nbytes: int) -> float:
    """Best of 1 and 4 threads: the faster a plain O_DIRECT writer gets, the stricter the bound."""
    return min(direct_write_each(path, nbytes).values())


def direct_read_seconds(path: str, nbytes: int) -> float:
    return min(_direct_io(path, nbytes, t, False) for t in (1, 4))


def for_checkpoint(nbytes: int, out_dir: str) -> dict:
    """The bounds of one checkpoint of nbytes, measured now: a memcpy and an O_DIRECT write."""
    scratch = os.path.join(out_dir, "bound.bin")
    bound = {"bytes": nbytes, "memcpy_s": memcpy_seconds({"w": torch.randn(nbytes // 4)}),
             "direct_write_s": direct_write_seconds(scratch, nbytes)}
    os.unlink(scratch)
    return bound
