"""Strategies G / C / D for one planned file on the CPU (LightCheck §III-A).

Owns taking the bytes of a FilePlan from live tensors into the native writer:
  c  copy threads fill bounded staging chunks; writers drain them (pipelined);
  g  a full second copy first (on CPU this is just a second host copy: the
     "spare device memory" of LightCheck is host memory here), then written;
  d  writers write straight from the live tensors; the gate holds until the
     bytes are in the file.
A held write (layer-wise checkpointing, c and d) moves nothing until records are
released, and each record's copy can be waited on alone (LightCheck §III-B).
CUDA tensors go through fastckpt.cuda_snapshot instead.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from . import _native
from .format.plan import FilePlan

STRATEGIES = ("c", "g", "d")


@dataclass
class FileResult:
    path: str
    bytes: int
    file_crc: int
    record_crcs: list[int]
    spans: list[tuple[int, int, int, int]]  # (record, file offset, length, crc)
    direct_io: bool
    names: list[str] = None  # record names, by index


class JobWrite:
    """What a write driven by one native job offers the Checkpointer while in flight: release
    of held records, per-record and whole copy waits, progress. Needs self._job and self._copied."""

    _job = None
    _copied: threading.Event

    def release(self, records: list[int]) -> None:
        """Held writes: start moving these records (indices into plan.records)."""
        if not self._copied.is_set():
            self._job.release(records)

    def release_all(self) -> None:
        if not self._copied.is_set():
            self._job.release_all()

    def wait_records(self, records: list[int], timeout: float | None = None) -> bool:
        """True once these records no longer read the caller's tensors."""
        if self._copied.is_set() or not records:
            return True
        return self._job.wait_records_copied(records, -1.0 if timeout is None else timeout)

    def wait_copied(self, timeout: float | None = None) -> bool:
        if self._copied.is_set():
            return True
        done = self._job.wait_copied(-1.0 if timeout is None else timeout)
        if done:
            self._copied.set()
        return done

    @property
    def bytes_written(self) -> int:
        return self._job.bytes_written


class FileWrite(JobWrite):
    """One file in flight. copied() releases the caller's gate; finish() makes it durable."""

    def __init__(self, engine: "_native.Engine", plan: FilePlan, path: str, strategy: str,
                 direct_io: bool, held: bool = False):
        self.plan, self.path = plan, path
        self._copied = threading.Event()
        self._error: BaseException | None = None
        self._job = None
        self._keep: list[torch.Tensor] = []
        pieces = [(r.storage.data_ptr(), r.nbytes, r.file_off, i)
                  for i, r in enumerate(plan.records) if r.nbytes]
        args = (plan.data_begin, plan.data_end, plan.file_size)
        n = len(plan.records)
        if strategy == "c":
            self._job = engine.submit(path, pieces, *args, _native.Mode.Stage, direct_io, n, held)
        elif strategy == "d":
            self._job = engine.submit(path, pieces, *args, _native.Mode.Direct, direct_io, n, held)
        elif strategy == "g":
            copies = []
            for (src, nbytes, off, i) in pieces:
                buf = torch.empty(nbytes, dtype=torch.uint8)
                _native.copy(buf.data_ptr(), src, nbytes, engine.copy_threads)
                self._keep.append(buf)
                copies.append((buf.data_ptr(), nbytes, off, i))
            self._copied.set()
            self._job = engine.submit(path, copies, *args, _native.Mode.Direct, direct_io, n)
        else:
            raise ValueError(f"unknown strategy {strategy!r}")

    def finish(self) -> FileResult:
        """Waits for the data, writes headers/directory, ftruncate + fdatasync."""
        self._job.release_all()
        self._job.wait_written(-1.0)
        self._copied.set()
        crcs = list(self._job.record_crcs())
        blobs, file_crc = self.plan.finish(crcs)
        self._job.finalize(blobs, self.plan.file_size)
        self._keep.clear()
        return FileResult(self.path, self.plan.file_size, file_crc, crcs,
                          [tuple(s) for s in self._job.span_crcs()], self._job.used_direct_io,
                          [r.name for r in self.plan.records])

    def abort(self, why: str) -> None:
        if self._job is not None:
            self._job.abort(why)


def start_write(engine, plan: FilePlan, path: str, strategy: str, direct_io: bool,
                held: bool = False):
    """FileWrite for host tensors, CudaFileWrite when any storage lives on a GPU."""
    if "cuda" in plan.devices():
        from .cuda_snapshot import CudaFileWrite
        return CudaFileWrite(engine, plan, path, strategy, direct_io, held)
    other = plan.devices() - {"cpu"}
    if other:
        raise ValueError(f"cannot checkpoint tensors on device type(s) {sorted(other)}; "
                         "move them to CPU or CUDA first")
    return FileWrite(engine, plan, path, strategy, direct_io, held)
