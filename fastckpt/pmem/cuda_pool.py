"""CUDA tensors straight into the pool (LightCheck-D / Portus zero-copy, GPU side).

The pool's mapping is registered with CUDA once per process (cudaHostRegister), so each
record is one device-to-host copy on a side stream whose destination is the pool itself:
no staging buffer. One event per record; a drain thread waits for them in order, takes
each record's CRC from the pool bytes, and persists them (cache-line write-back + fence
on real PMEM, msync elsewhere: DMA does not go around the CPU caches by itself). Where the
mapping cannot be registered (fsdax refuses long-term pins), records bounce through a
pinned buffer and a native copy; the log says so. Inert without CUDA.
"""
from __future__ import annotations

import logging
import threading

import torch

from .. import _native
from ..cuda_snapshot import _bytes_of, _host_view
from ..format.plan import FilePlan
from .pool import Pool

log = logging.getLogger("fastckpt")
_registered: dict[int, bool] = {}  # pool base address -> registered with CUDA


def register_pool(pool: Pool) -> bool:
    """cudaHostRegister on the whole mapping, once; False when CUDA refuses it."""
    base = pool.native.address
    if base not in _registered:
        err = int(torch.cuda.cudart().cudaHostRegister(base, pool.size, 0))
        _registered[base] = err == 0
        if err:
            log.warning("fastckpt: cudaHostRegister of pool %s failed (error %d); CUDA tensors go "
                        "through a pinned bounce buffer", pool.path, err)
    return _registered[base]


def unregister_pool(pool: Pool) -> None:
    if _registered.pop(pool.native.address, False):
        torch.cuda.cudart().cudaHostUnregister(pool.native.address)


class CudaMappedWrite:
    """MappedWrite's interface for plans with CUDA storages."""

    def __init__(self, engine, pool: Pool, plan: FilePlan, data_off: int, strategy: str, held: bool = False):
        self.plan, self.pool, self.engine = plan, pool, engine
        self.shift = data_off - plan.data_begin
        dev = next(r.storage.device for r in plan.records if r.storage.device.type == "cuda")
        self.stream = torch.cuda.Stream(dev)
        self.stream.wait_stream(torch.cuda.current_stream(dev))  # the values as of save()
        self.zero_copy = register_pool(pool)
        self.mode = "pool-registered" if self.zero_copy else "pinned-bounce"
        n = len(plan.records)
        self._events: list = [None] * n
        self._done = [threading.Event() for _ in range(n)]
        self._issued = [False] * n
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._crcs = [0] * n
        self._written = 0
        self._order: list[int] = []
        self._cv = threading.Condition(self._lock)
        if not held:
            self.release_all()
        self._thread = threading.Thread(target=self._drain, name="fastckpt-pool-drain", daemon=True)
        self._thread.start()

    def _copy(self, i: int) -> None:
        r = self.plan.records[i]
        dst_off = r.file_off + self.shift
        if not r.nbytes:
            return
        src = _bytes_of(r.storage)
        with torch.cuda.stream(self.stream):
            if self.zero_copy or r.storage.device.type == "cpu":
                dst = _host_view(self.pool.address(dst_off), r.nbytes)
                dst.copy_(src, non_blocking=True)
            else:
                bounce = torch.empty(r.nbytes, dtype=torch.uint8, pin_memory=True)
                bounce.copy_(src, non_blocking=True)
                self._bounce = getattr(self, "_bounce", {})
                self._bounce[i] = bounce
        ev = torch.cuda.Event()
        ev.record(self.stream)
        self._events[i] = ev

    def release(self, records) -> None:
        with self._cv:
            for i in records:
                if not self._issued[i]:
                    self._issued[i] = True
                    self._copy(i)
                    self._order.append(i)
            self._cv.notify_all()

    def release_all(self) -> None:
        self.release(range(len(self.plan.records)))

    def _drain(self) -> None:
        try:
            for k in range(len(self.plan.records)):
                with self._cv:
                    self._cv.wait_for(lambda: len(self._order) > k)
                    i = self._order[k]
                r = self.plan.records[i]
                if self._events[i] is not None:
                    self._events[i].synchronize()
                off = r.file_off + self.shift
                bounce = getattr(self, "_bounce", {}).pop(i, None)
                if bounce is not None:
                    _native.copy(self.pool.address(off), bounce.data_ptr(), r.nbytes, self.engine.copy_threads)
                self._done[i].set()  # the caller's tensor is no longer read
                if r.nbytes:
                    self._crcs[i] = _native.crc32(self.pool.address(off), r.nbytes)
                    self.pool.native.persist(off, r.nbytes)
                    self._written += r.nbytes
        except BaseException as e:  # noqa: BLE001 - raised again by finish()
            self._error = e
            for ev in self._done:
                ev.set()

    def wait_records(self, records, timeout: float | None = None) -> bool:
        self.release(records)
        ok = all(self._done[i].wait(timeout) for i in records)
        if self._error is not None:
            raise self._error
        return ok

    def wait_copied(self, timeout: float | None = None) -> bool:
        return self.wait_records(range(len(self.plan.records)), timeout)

    @property
    def bytes_written(self) -> int:
        return self._written

    def finish(self):
        self.release_all()
        self._thread.join()
        if self._error is not None:
            raise self._error
        blobs, image_crc = self.plan.finish(self._crcs)
        (off, header), = blobs
        spans = [(i, r.file_off, r.nbytes, c) for i, (r, c) in enumerate(zip(self.plan.records, self._crcs))]
        return list(self._crcs), spans, header, image_crc

    def abort(self, why: str) -> None:
        self._error = self._error or RuntimeError(why)
