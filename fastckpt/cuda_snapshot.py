"""Snapshots of CUDA tensors: side stream + events, pinned staging, spare device memory, GDS.

Owns the GPU half of strategies (LightCheck §III-A):
  c  D2H copies on a side stream into pinned staging chunks, one event per
     chunk; a feeder thread hands each chunk to the native writers as soon as
     its event completes (copy and write pipelined);
  g  one device-to-device copy into spare GPU memory (gate released when that
     event completes), then drained like c; falls back to c if memory is short;
  d  kvikio CuFile writes straight from device memory (GDS, or kvikio's compat
     mode); the gate holds until written. Without kvikio: c with the gate held.
Everything here is inert without CUDA; pin_host_memory() is a no-op then.
"""
from __future__ import annotations

import ctypes
import logging
import os
import queue
import threading
from collections import deque

import numpy as np
import torch

from . import _native
from .format.plan import FilePlan
from .snapshot import FileResult

log = logging.getLogger("fastckpt")
_pinned: set[int] = set()


def pin_host_memory(addresses: list[int], nbytes: int) -> bool:
    """cudaHostRegister on staging chunks (so D2H copies run async at full speed)."""
    if not addresses or not torch.cuda.is_available():
        return False
    cudart = torch.cuda.cudart()
    for a in addresses:
        if int(cudart.cudaHostRegister(a, nbytes, 0)) != 0:
            log.warning("fastckpt: cudaHostRegister failed; staging stays pageable")
            return False
        _pinned.add(a)
    return True


def unpin_host_memory(addresses: list[int]) -> None:
    if not _pinned:
        return
    cudart = torch.cuda.cudart()
    for a in addresses:
        if a in _pinned:
            cudart.cudaHostUnregister(a)
            _pinned.discard(a)


def kvikio_mode() -> str | None:
    """'gds', 'compat' or None (kvikio missing or no usable driver)."""
    try:
        import kvikio
        import kvikio.defaults
    except Exception:  # noqa: BLE001 - any import failure means "not here"
        return None
    try:
        compat = kvikio.defaults.get("compat_mode") if hasattr(kvikio.defaults, "get") else kvikio.defaults.compat_mode()
    except Exception:  # noqa: BLE001
        return None
    return "compat" if str(compat).lower() not in ("false", "compatmode.off", "0") else "gds"


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _host_view(addr: int, n: int) -> torch.Tensor:
    return torch.from_numpy(np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(addr)))


class CudaFileWrite:
    """Same interface as snapshot.FileWrite, for plans holding CUDA storages."""

    def __init__(self, engine, plan: FilePlan, path: str, strategy: str, direct_io: bool,
                 held: bool = False):
        self.plan, self.path, self.engine = plan, path, engine
        dev = next(r.storage.device for r in plan.records if r.storage.device.type == "cuda")
        self.stream = torch.cuda.Stream(dev)
        self.stream.wait_stream(torch.cuda.current_stream(dev))  # see the values as of save()
        self._copied = threading.Event()
        self._error: BaseException | None = None
        self._hold_gate = strategy == "d"
        self.sources = [r.storage for r in plan.records]
        self.mode = "pinned-staging"
        self._kvikio = strategy == "d" and kvikio_mode() is not None
        if strategy == "d" and not self._kvikio:
            log.warning("fastckpt: strategy 'd' needs kvikio for CUDA tensors; using pinned bounce "
                        "buffers with the gate held until written")
        if strategy == "g":
            self._device_copy(dev)
        self._job = None
        if not self._kvikio:
            pieces = [(0, r.nbytes, r.file_off, i) for i, r in enumerate(plan.records) if r.nbytes]
            self._job = engine.submit(path, pieces, plan.data_begin, plan.data_end, plan.file_size,
                                      _native.Mode.External, direct_io, len(plan.records))
        # Layer-wise: chunks are fed in the order records are released; each has its own latch.
        n_chunks = self._job.n_chunks if self._job is not None else 0
        self._chunk_done = [threading.Event() for _ in range(n_chunks)]
        self._order: "queue.Queue[int]" = queue.Queue()
        self._issued = [False] * n_chunks
        self._issue_lock = threading.Lock()
        if not held or strategy == "g":
            self.release_all()
        self._thread = threading.Thread(target=self._run, name="fastckpt-cuda-feeder", daemon=True)
        self._thread.start()

    def _device_copy(self, dev) -> None:
        need = sum(r.nbytes for r in self.plan.records if r.storage.device.type == "cuda")
        free, _ = torch.cuda.mem_get_info(dev)
        if need * 1.1 > free:
            log.warning("fastckpt: strategy 'g' needs %d MiB of spare GPU memory, %d MiB free; "
                        "using 'c' for this checkpoint", need >> 20, free >> 20)
            return
        copies = []
        with torch.cuda.stream(self.stream):
            for s in self.sources:
                if s.device.type == "cuda" and s.nbytes():
                    buf = torch.empty(s.nbytes(), dtype=torch.uint8, device=s.device)
                    buf.copy_(_bytes_of(s), non_blocking=True)
                    copies.append(buf.untyped_storage())
                else:
                    copies.append(s)
        self._g_event = torch.cuda.Event()
        self._g_event.record(self.stream)
        self.sources, self.mode = copies, "device-copy"

    def _chunks_of(self, records) -> list[int]:
        if self._job is None:
            return []
        size = self.engine.pool.chunk_bytes
        out = []
        for i in records:
            r = self.plan.records[i]
            if r.nbytes:
                first = (r.file_off - self.plan.data_begin) // size
                last = (r.file_off + r.nbytes - 1 - self.plan.data_begin) // size
                out.extend(range(first, last + 1))
        return out

    def _issue(self, chunks) -> None:
        with self._issue_lock:
            for c in chunks:
                if not self._issued[c]:
                    self._issued[c] = True
                    self._order.put(c)

    def release(self, records) -> None:
        self._issue(self._chunks_of(records))

    def release_all(self) -> None:
        self._issue(range(len(self._issued)))

    def wait_records(self, records, timeout: float | None = None) -> bool:
        if self._hold_gate or self._job is None:
            return self.wait_copied(timeout)
        self.release(records)
        for c in self._chunks_of(records):
            if not self._chunk_done[c].wait(timeout):
                return False
        if self._error is not None:
            raise self._error
        return True

    def _chunk_pieces(self, c: int):
        b = self._job.chunk_begin(c)
        e = b + self._job.chunk_len(c)
        for r, s in zip(self.plan.records, self.sources):
            lo, hi = max(b, r.file_off), min(e, r.file_off + r.nbytes)
            if lo < hi:
                yield s, lo - r.file_off, lo - b, hi - lo

    def _run(self) -> None:
        try:
            if getattr(self, "_g_event", None) is not None:
                self._g_event.synchronize()
                self._copied.set()
            if self._kvikio:
                self._write_kvikio()
            else:
                self._feed()
            if not self._hold_gate:
                self._copied.set()
        except BaseException as e:  # noqa: BLE001 - raised again by finish()
            self._error = e
            if self._job is not None:
                self._job.abort(str(e))
            for ev in self._chunk_done:
                ev.set()
            self._copied.set()

    def _feed(self) -> None:
        pool = self.engine.pool
        inflight: deque = deque()
        for _ in range(self._job.n_chunks):
            try:
                c = self._order.get(timeout=0.005 if inflight else None)
            except queue.Empty:  # nothing released lately: hand over what is already copying
                self._push(*inflight.popleft())
                c = self._order.get()
            slot = pool.acquire()
            dst = _host_view(pool.address(slot), pool.chunk_bytes)
            with torch.cuda.stream(self.stream):
                for s, src_off, dst_off, n in self._chunk_pieces(c):
                    dst[dst_off:dst_off + n].copy_(_bytes_of(s)[src_off:src_off + n], non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(self.stream)
            inflight.append((c, slot, ev))
            while len(inflight) > 2:
                self._push(*inflight.popleft())
        while inflight:
            self._push(*inflight.popleft())

    def _push(self, c: int, slot: int, ev) -> None:
        ev.synchronize()
        self._chunk_done[c].set()
        self._job.push_chunk(c, slot)

    def _write_kvikio(self) -> None:
        import kvikio
        with kvikio.CuFile(self.path, "w") as f:
            futures = []
            for r, s in zip(self.plan.records, self.sources):
                if r.nbytes:
                    buf = _bytes_of(s)
                    if buf.device.type == "cpu":
                        buf = buf.numpy()
                    futures.append(f.pwrite(buf, r.nbytes, r.file_off))
            torch.cuda.current_stream().synchronize()
            for fu in futures:
                fu.get()
        self.mode = f"kvikio-{kvikio_mode()}"

    def wait_copied(self, timeout: float | None = None) -> bool:
        return self._copied.wait(timeout)

    @property
    def bytes_written(self) -> int:
        return self._job.bytes_written if self._job is not None else 0

    def finish(self) -> FileResult:
        self.release_all()
        self._thread.join()
        if self._error is not None:
            raise self._error
        if self._job is not None:
            self._job.wait_written(-1.0)
            crcs = list(self._job.record_crcs())
            blobs, file_crc = self.plan.finish(crcs)
            self._job.finalize(blobs, self.plan.file_size)
            spans = [tuple(s) for s in self._job.span_crcs()]
            direct = self._job.used_direct_io
        else:  # kvikio wrote the data: CRCs come from reading it back, off the critical path
            from .verify import range_crcs
            crcs = range_crcs(self.path, [(r.file_off, r.nbytes) for r in self.plan.records])
            blobs, file_crc = self.plan.finish(crcs)
            fd = os.open(self.path, os.O_WRONLY)
            try:
                for off, data in blobs:
                    os.pwrite(fd, data, off)
                os.ftruncate(fd, self.plan.file_size)
                os.fdatasync(fd)
            finally:
                os.close(fd)
            spans = [(i, r.file_off, r.nbytes, c) for i, (r, c) in enumerate(zip(self.plan.records, crcs))]
            direct = False
        self._copied.set()
        self.sources = []
        return FileResult(self.path, self.plan.file_size, file_crc, crcs, spans, direct,
                          [r.name for r in self.plan.records])

    def abort(self, why: str) -> None:
        if self._job is not None:
            self._job.abort(why)
