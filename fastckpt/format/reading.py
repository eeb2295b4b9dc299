"""Bringing a file's records into memory, CRC-checked in parallel.

mmap=True: the file is mapped privately (copy-on-write, as torch.load(mmap=True)
does) and each record becomes a zero-copy view; with verify=True every byte is
read once, by the parallel CRC, so the data is resident when load returns.
mmap=False: parallel reads into fresh anonymous memory, CRC'd while hot (a
cold file's large records with O_DIRECT, around the page cache). mmap=None (a
CPU load's default): mapped, unless a verified load finds the file cold.
read_into: parallel reads into tensors the caller owns (a load's own
destination), CRC'd while hot.
"""
from __future__ import annotations

import ctypes
import os
from contextlib import contextmanager

import torch

from .. import _native, progress
from ..machine import available_memory, hardware_threads, read_threads

SPLIT = 64 << 20  # per-thread piece: large enough to read sequentially on a virtual disk
GROUP = 256 << 20  # with a progress bar open, the records are read in groups of about this many bytes


def _in_groups(items: list, nbytes, call) -> list:
    """call(items) -> one result per item, over all items at once; with a progress bar open
    (fastckpt.progress), over groups of about GROUP bytes, the bar moved after each."""
    if progress.bar() is None:
        return list(call(items))
    out, group, size = [], [], 0
    for item in items + [None]:
        if item is not None:
            group.append(item)
            size += nbytes(item)
        if group and (item is None or size >= GROUP):
            out.extend(call(group))
            progress.report(size)
            group, size = [], 0
    return out


@contextmanager
def file_bytes(path: str, at: int | None = None):
    """(read(offset, n) -> bytes, the file's size) for the block: pread through a descriptor of
    the file, or, with `at` (the address where the caller holds the whole file's bytes, a
    mapping), read there and the file never opened (a child forked meanwhile inherits no
    descriptor of it). The caller checks the bounds."""
    if at is not None:
        yield (lambda off, n: ctypes.string_at(at + off, n) if n > 0 else b""), os.path.getsize(path)
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise FileNotFoundError(f"checkpoint file {path!r} does not exist") from None
    try:
        yield (lambda off, n: os.pread(fd, n, off)), os.fstat(fd).st_size
    finally:
        os.close(fd)


def _fits_in_memory(path: str) -> bool:
    """Whether a file's bytes fit in half the memory available now: a cold file that does not is
    mapped (its pages the kernel may evict and read again), not read into anonymous memory."""
    return os.path.getsize(path) <= available_memory() // 2


def read_records(path: str, spans: list[tuple[int, int]], verify: bool, mmap: bool | None = True,
                 threads: int | None = None) -> tuple[list[torch.Tensor], list[int]]:
    """spans: (file offset, length) per record -> (uint8 tensors, CRC-32s or zeros). threads:
    reads in flight (default: fastckpt.machine.read_threads()). mmap=None: the file is mapped
    unless every byte is to be checked (verify) and most of it is not in the page cache: a cold
    file is read instead, around the cache, which on this project's VM took 0.40-0.48 s for
    1 GiB against 0.44-0.77 s for faulting a mapping of it in (one larger than half the memory
    available stays mapped)."""
    threads = threads or read_threads()
    if mmap is None:
        mmap = not verify or _native.file_mostly_cached(path) or not _fits_in_memory(path)
    if mmap and any(n for _, n in spans):
        size = os.path.getsize(path)
        whole = torch.UntypedStorage.from_file(path, False, size)
        bufs = [torch.empty(0, dtype=torch.uint8).set_(whole[off:off + n]) if n
                else torch.empty(0, dtype=torch.uint8) for off, n in spans]
        crcs = (_in_groups([(b.data_ptr(), b.numel()) for b in bufs], lambda r: r[1],
                           lambda rs: _native.crc_ranges(rs, threads, SPLIT))
                if verify else [0] * len(bufs))
        return bufs, list(crcs)
    bufs = [torch.empty(n, dtype=torch.uint8) for _, n in spans]
    crcs = _in_groups([(b.data_ptr(), off, n) for b, (off, n) in zip(bufs, spans)], lambda r: r[2],
                      lambda rs: _native.read_ranges(path, rs, threads, SPLIT, verify))
    return bufs, list(crcs)


def read_into(path: str, places: list[tuple[torch.Tensor, int]], verify: bool,
              threads: int | None = None) -> list[int]:
    """places: (contiguous CPU tensor, file offset) -> each tensor's bytes read from its offset
    in one parallel pass (the tensor's memory is the destination: no buffer of our own);
    returns their CRC-32s (zeros when not verify)."""
    for t, _ in places:
        if t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError("read_into fills contiguous CPU tensors")
    threads = threads or read_threads()
    return _in_groups([(t.data_ptr(), off, t.nbytes) for t, off in places], lambda r: r[2],
                      lambda rs: _native.read_ranges(path, rs, threads, SPLIT, verify))


def range_crcs(path: str, ranges: list[tuple[int, int]], bounce_bytes: int = 64 << 20,
               at: int | None = None) -> list[int]:
    """CRC-32 of each (offset, length) range of a file, reading through one bounce buffer;
    at: the address where the file's bytes already lie in memory (a mapping or a buffer the
    caller holds, as long as the file): computed there, in parallel, nothing read or copied."""
    if at is not None:
        return _in_groups([(at + off, n) for off, n in ranges], lambda r: r[1],
                          lambda rs: _native.crc_ranges(rs, hardware_threads(), SPLIT)) if ranges else []
    bounce = torch.empty(min(bounce_bytes, max([n for _, n in ranges] + [1])), dtype=torch.uint8)
    out = []
    for off, n in ranges:
        crc = 0
        for done in range(0, n, bounce.numel()):
            k = min(bounce.numel(), n - done)
            (c,) = _native.read_ranges(path, [(bounce.data_ptr(), off + done, k)], 4, 16 << 20, True)
            crc = _native.crc32_concat(crc, c, k)
            progress.report(k)
        out.append(crc)
    return out
