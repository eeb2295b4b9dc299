"""CUDA tensors straight into a mapped pool version (LightCheck-D / Portus zero-copy, GPU side).

The pool's mapping is registered with CUDA once per process (pinning.register), so each
record is one device-to-host copy on the side stream whose destination is the pool itself:
no staging. The copy of a record is issued by the thread that releases it (at once when not
held; by the layer-wise hook or the gate otherwise). A drain thread takes records in the
order they were released, waits for each one's mark, takes its CRC from the pool bytes and
persists them (cache-line write-back + fence on real PMEM, msync elsewhere: DMA does not go
around the CPU caches by itself). Where the mapping cannot be registered (fsdax refuses
long-term pins), records bounce through a pinned buffer and a native copy; the log says so.
"""
from __future__ import annotations

import threading

import torch

from .. import _native
from .device_write import DeviceWrite, ReleaseOrder, host_view
from .pinning import register
from .protocol import MappedSink, WriteResult
from .streams import HostStream


class DeviceMappedWrite(DeviceWrite):
    """One pool version of CUDA (stream-read) tensors in flight."""

    @classmethod
    def stages(cls, strategy: str, gds: bool = True) -> bool:
        return False

    def __init__(self, engine, plan, sink: MappedSink, strategy: str, deadline, held: bool = False, stream=None):
        if plan.format != "safetensors":
            raise ValueError("a pool keeps safetensors images")
        super().__init__(engine, plan, sink, "c", deadline, stream,  # the pool is the staging: no g copy
                         f"{sink.pool.path} at offset {sink.data_off}")
        self.shift = sink.data_off - plan.data_begin
        native = sink.pool.native
        self.zero_copy = (isinstance(self.source.stream, HostStream)
                          or register(native.address, native.size, f"pool {sink.pool.path}"))
        self.mode = "pool-registered" if self.zero_copy else "pinned-bounce"
        n = len(plan.records)
        self._marks: list = [None] * n
        self._bounce: dict[int, torch.Tensor] = {}
        self._order: list[int] = []  # records in the order they were released
        self._released: set[int] = set()
        self._cv = threading.Condition()
        self._crcs = [0] * n
        self._written_bytes = 0
        self.units = ReleaseOrder(n, held=True)  # releases issue copies here, not in ReleaseOrder
        if not held:
            self.release_all()
        self._start("fastckpt-pool-drain")

    # -- (1) release: the copies are issued by the releasing thread ---------------
    def release(self, records) -> None:
        if self._error is not None:
            return
        with self._cv:
            fresh = [i for i in records if i not in self._released]
            for i in fresh:
                self._released.add(i)
                self._copy(i)
                self._order.append(i)
            self.units.release(fresh)
            self._cv.notify_all()

    def release_all(self) -> None:
        self.release(range(len(self.plan.records)))

    def _copy(self, i: int) -> None:
        r = self.plan.records[i]
        if not r.nbytes:
            return
        src = self.source.view(i)
        if self.zero_copy or r.storage.device.type == "cpu":
            dst = host_view(self.sink.pool.address(r.file_off + self.shift), r.nbytes)
        else:
            dst = self._bounce[i] = torch.empty(r.nbytes, dtype=torch.uint8, pin_memory=True)
        self.source.stream.copy(dst, src)
        self._marks[i] = self.source.stream.mark()

    def _gate_latches(self, records, release: bool = True):
        records = list(range(len(self.plan.records)) if records is None else records)
        if release:
            self.release(records)
        return [self.units.done[i] for i in records]

    # -- the drain ------------------------------------------------------------
    def _run(self) -> None:
        pool = self.sink.pool
        for k in range(len(self.plan.records)):
            with self._cv:  # held time: no deadline until the k-th record is released
                while len(self._order) <= k:
                    if self._error is not None:
                        return
                    self._cv.wait(0.5)
                i = self._order[k]
            r = self.plan.records[i]
            if self._marks[i] is not None:
                self._wait_mark(self._marks[i], f"the copy of record {r.name!r} into {self.where}")
            off = r.file_off + self.shift
            bounce = self._bounce.pop(i, None)
            if bounce is not None:
                _native.copy(pool.address(off), bounce.data_ptr(), r.nbytes, self.engine.copy_threads)
            self.units.done[i].set()  # the caller's tensor is no longer read
            if r.nbytes:
                with self.clock.phase("crc"):
                    self._crcs[i] = _native.crc32(pool.address(off), r.nbytes)
                with self.clock.phase("persist"):
                    pool.native.persist(off, r.nbytes)
                self._written_bytes += r.nbytes
            self._moved_one()
        self.clock.at("copied_at")
        self.clock.at("written_at")

    # -- (3) finish, (4) abort ------------------------------------------------
    def finish(self) -> WriteResult:
        self._finish_worker(self.units.all_released)
        blobs, image_crc = self.plan.finish(self._crcs)
        spans = [(i, r.file_off, r.nbytes, c) for i, (r, c) in enumerate(zip(self.plan.records, self._crcs))]
        self.source.close()
        self._let_go()
        return WriteResult(self.where, self.plan.file_size, image_crc, list(self._crcs), spans, False,
                           [r.name for r in self.plan.records], blobs)

    def _stop(self, timeout: float) -> bool:
        """Copies already issued still land in the pool: wait (up to `timeout`) for them before
        the version's room can be claimed again."""
        with self._cv:
            self._cv.notify_all()
        try:
            return self.source.stream.mark().wait(timeout)
        except Exception:  # noqa: BLE001 - a copy failed: the stream is past it all the same
            return True

    @property
    def bytes_written(self) -> int:
        return self._written_bytes
