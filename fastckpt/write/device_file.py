"""CUDA tensors into a file (LightCheck §III-A, GPU side).

  c  a feeder thread takes chunks in the order they are released, copies each chunk's
     pieces on the side stream into a pinned staging chunk, and once the chunk's mark
     completes sets its latch and hands it to the native writers (copy and write pipelined;
     a chunk waits for a free staging chunk by completing its own chunks in flight first);
  g  everything is first copied into spare device memory while save() runs; the gate is
     released once that copy completes; the copies are then drained like c;
  d  kvikio writes each record straight from device memory (GDS, or kvikio's compat mode)
     once the data as of save() is ready; the gate holds until each record is written.
     Without kvikio (or with the sink's gds=False): c, with the gate held until written.
"""
from __future__ import annotations

import bisect
import threading
from collections import deque

import torch

from .. import _native
from ..format import device_crc
from ..format.reading import range_crcs
from .device_write import DeviceWrite, ReleaseOrder, host_view
from .gds import GdsFile, finish_file, kvikio_mode
from .job_write import finalized
from .protocol import FileSink, WriteResult

DEPTH = 2  # chunks whose copies may be in flight on the stream before the oldest is handed over


def uses_gds(strategy: str, gds: bool) -> bool:
    return strategy == "d" and gds and kvikio_mode() is not None


class DeviceFileWrite(DeviceWrite):
    """One file of CUDA (stream-read) tensors in flight."""

    @classmethod
    def stages(cls, strategy: str, gds: bool = True) -> bool:
        return not uses_gds(strategy, gds)

    def __init__(self, engine, plan, sink: FileSink, strategy: str, deadline, held: bool = False, stream=None):
        super().__init__(engine, plan, sink, strategy, deadline, stream, sink.path)
        self._gds = uses_gds(strategy, sink.gds)
        self._chunk_bytes = engine.pool.chunk_bytes
        self._hold_gate = strategy == "d"  # the gate waits for the bytes in the file
        self._written = threading.Event()
        self._written_bytes = 0
        self._job = None
        self._crcs: dict[int, int] = {}  # d with kvikio: record -> CRC-32 taken where its bytes are
        if self._gds:
            self.mode = f"kvikio-{kvikio_mode()}"
            n_units = len(plan.records)
        else:
            pieces = [(0, r.nbytes, r.file_off, i) for i, r in enumerate(plan.records) if r.nbytes]
            self._job = engine.submit(sink.path, pieces, plan.data_begin, plan.data_end, plan.file_size,
                                      _native.Source.External, sink.direct_io, len(plan.records))
            self.mode = "device-copy" if self.source.spare_copied is not None else "pinned-staging"
            n_units = self._job.n_chunks
        self._by_offset = sorted((i for i, r in enumerate(plan.records) if r.nbytes),
                                 key=lambda i: plan.records[i].file_off)  # data records do not overlap
        self._offsets = [plan.records[i].file_off for i in self._by_offset]
        self._spare_done = threading.Event()
        self._handed = 0  # chunks handed to the writers
        self.units = ReleaseOrder(n_units, held and self.source.spare_copied is None)
        self._start("fastckpt-device-feeder")

    # -- (1) release --------------------------------------------------------
    def _units_of(self, records) -> list[int]:
        if self._gds:
            return list(records)
        size, begin, out = self._chunk_bytes, self.plan.data_begin, []
        for i in records:
            r = self.plan.records[i]
            if r.nbytes:
                out.extend(range((r.file_off - begin) // size, (r.file_off + r.nbytes - 1 - begin) // size + 1))
        return out

    def release(self, records) -> None:
        self.units.release(self._units_of(records))

    def release_all(self) -> None:
        self.units.release(range(len(self.units.done)))

    def _gate_latches(self, records, release: bool = True):
        everything = records is None
        records = range(len(self.plan.records)) if everything else records
        if self.source.spare_copied is not None:
            return [self._spare_done]
        if self._hold_gate and not self._gds:  # staged d: until the whole file's data is written
            if release:
                self.release_all()
            return [self._written]
        units = self._units_of(records)
        if release:
            self.units.release(units)
        return [self.units.done[u] for u in units]

    # -- the feeder ---------------------------------------------------------
    def _run(self) -> None:
        if self.source.spare_copied is not None:
            self._wait_mark(self.source.spare_copied, f"the copy into spare device memory for {self.where}")
            self._spare_done.set()
            self.clock.at("copied_at")
        if self._gds:
            self._write_gds()
        else:
            self._feed()

    def _feed(self) -> None:
        pool = self.engine.pool
        inflight: deque = deque()
        try:
            for _ in range(self._job.n_chunks):
                c = self.units.next(lambda: self._hand_over(inflight))
                if c is None:
                    return
                slot = self._acquire(pool, inflight)
                inflight.append([c, slot, None])  # from here on the chunk is returned even if a copy fails
                with self.clock.phase("enqueue"):
                    dst = host_view(pool.address(slot), pool.chunk_bytes)
                    for i, src_off, dst_off, n in self._chunk_pieces(c):
                        self.source.stream.copy(dst[dst_off:dst_off + n], self.source.view(i)[src_off:src_off + n])
                    inflight[-1][2] = self.source.stream.mark()
                while inflight and (len(inflight) > DEPTH or inflight[0][2].query()):
                    self._hand_over(inflight)
            while inflight:
                self._hand_over(inflight)
        finally:
            self._give_back(pool, inflight)
        if self._hold_gate:
            self.deadline.wait(lambda: f"the writers of {self.where} ({self._job.status()})", self._job.wait_written)
            self._written.set()
            self.clock.at("copied_at", dict(self._job.timings())["written_at"])  # the gate held until then

    def _chunk_pieces(self, c: int):
        """(record, offset in the record, offset in the chunk, length) of chunk c's bytes."""
        b = self._job.chunk_begin(c)
        e = b + self._job.chunk_len(c)
        first = max(0, bisect.bisect_right(self._offsets, b) - 1)
        for i in self._by_offset[first:]:
            r = self.plan.records[i]
            if r.file_off >= e:
                break
            lo, hi = max(b, r.file_off), min(e, r.file_off + r.nbytes)
            if lo < hi:
                yield i, lo - r.file_off, lo - b, hi - lo

    def _acquire(self, pool, inflight) -> int:
        """A free staging chunk: our own chunks in flight are handed over first to free one."""
        while True:
            slot = pool.acquire(0.0)
            if slot >= 0:
                return slot
            if inflight:  # our own chunks in flight hold the rest: their copies' wait is stream_wait
                self._hand_over(inflight)
                continue
            got: list[int] = []

            def attempt(seconds: float) -> bool:
                s = pool.acquire(seconds)
                if s >= 0:
                    got.append(s)
                return s >= 0

            with self.clock.phase("chunk_wait"):
                self.deadline.wait(lambda: f"a free staging chunk for {self.where} (all {pool.capacity} in use)",
                                   attempt)
            return got[0]

    def _hand_over(self, inflight) -> bool:
        """The oldest chunk in flight, once copied, to the writers; False when none is in flight."""
        if not inflight:
            return False
        c, slot, mark = inflight[0]
        self._wait_mark(mark, f"the copy of chunk {c} for {self.where}")
        inflight.popleft()
        self.units.done[c].set()
        self._handed += 1
        if self._handed == self._job.n_chunks and not self._hold_gate:
            self.clock.at("copied_at")  # before the writers have the last chunk: it is written after
        self._job.push_chunk(c, slot)
        self._moved_one()
        return True

    def _give_back(self, pool, inflight) -> None:
        """After a failure: chunks still in flight go back to the pool once their copies are done."""
        while inflight:
            c, slot, mark = inflight.popleft()
            try:
                self._wait_mark(mark or self.source.stream.mark(), f"the copy of chunk {c} for {self.where}")
                pool.release(slot)
            except BaseException:  # noqa: BLE001 - a copy that never ends keeps its chunk
                pass

    # -- d with kvikio --------------------------------------------------------
    def _write_gds(self) -> None:
        self._wait_mark(self.source.stream.mark(), f"the tensors of {self.where} as of save()")
        f = GdsFile(self.sink.path)
        futures: dict[int, object] = {}
        # each record's CRC-32 where it is while kvikio writes it (both only read the tensor, which the
        # held gate keeps as of save()); without CuPy, finish() reads the file back instead
        crc_streams: dict | None = {} if device_crc.available() else None
        try:
            for i, r in enumerate(self.plan.records):
                if not r.nbytes:
                    self.units.done[i].set()
            todo = sum(1 for r in self.plan.records if r.nbytes)
            while todo:
                i = self.units.next(lambda: self._reap(futures, wait=True))
                if i is None:
                    return
                if self.plan.records[i].nbytes:
                    view = self.source.view(i)
                    futures[i] = f.pwrite(view, self.plan.records[i].file_off)
                    if crc_streams is not None:
                        self._crcs[i] = self._crc_of(view, crc_streams)
                    todo -= 1
                self._reap(futures, wait=False)
            while futures:
                self._reap(futures, wait=True)
        finally:
            for fu in futures.values():  # after a failure: kvikio may still read device memory
                try:
                    fu.get()
                except BaseException:  # noqa: BLE001 - the first error is already the write's
                    pass
            f.close()

    @staticmethod
    def _crc_of(view, streams: dict) -> int:
        """A record's CRC-32 where its bytes are: on its GPU (one side stream per device), or on the
        host for the CPU tensors of a CUDA state (Adam's step counters)."""
        if view.is_cuda and view.device not in streams:
            streams[view.device] = torch.cuda.Stream(view.device)
        return device_crc.crc32_where_it_is(view, streams.get(view.device))

    def _reap(self, futures: dict, wait: bool) -> bool:
        if not futures:
            return False
        if wait:
            self.deadline.sleep_until(lambda: f"kvikio writes of {len(futures)} record(s) to {self.where}",
                                      lambda: any(fu.done() for fu in futures.values()))
        for i, fu in list(futures.items()):
            if fu.done():
                fu.get()  # raises the write's error
                del futures[i]
                self._written_bytes += self.plan.records[i].nbytes
                self.units.done[i].set()
                self._moved_one()
                if all(e.is_set() for e in self.units.done):
                    self.clock.at("copied_at")
                    self.clock.at("written_at")
        return True

    # -- (3) finish, (4) abort ------------------------------------------------
    def finish(self) -> WriteResult:
        self._finish_worker(self.units.all_released)
        plan = self.plan
        if self._gds:  # the data never passed the host: CRCs from the device, else read back from the file
            wanted = [i for i, r in enumerate(plan.records) if r.nbytes]
            if all(i in self._crcs for i in wanted):
                crcs = [self._crcs.get(i, 0) for i in range(len(plan.records))]
            else:
                crcs = range_crcs(self.where, [(r.file_off, r.nbytes) for r in plan.records])
            blobs, file_crc = plan.finish(crcs)
            finish_file(self.where, blobs, plan.file_size)
            spans = [(i, r.file_off, r.nbytes, c) for i, (r, c) in enumerate(zip(plan.records, crcs))]
            direct, refused = False, False
        else:
            crcs, blobs, file_crc = finalized(self._job, plan, lambda latch, what: self.deadline.wait(
                lambda: f"{what} of {self.where} ({self._job.status()})", latch))
            spans = [tuple(s) for s in self._job.span_crcs()]
            direct, refused = self._job.used_direct_io, self._job.direct_io_refused
        self._written.set()
        self.source.close()
        self._let_go()
        return WriteResult(self.where, plan.file_size, file_crc, crcs, spans, direct,
                           [r.name for r in plan.records], blobs, refused)

    @property
    def bytes_written(self) -> int:
        return self._job.bytes_written if self._job is not None else self._written_bytes

    def _stop(self, timeout: float) -> bool:
        self._written.set()
        self._spare_done.set()
        if self._job is None:
            return True
        return self._job.abort(str(self._error), timeout)
