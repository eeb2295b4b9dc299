"""The write protocol: one checkpoint file (or pool version) in flight, from live tensors to a sink.

Every implementation (host or CUDA tensors x file or mapped pool, see select.py) is driven
in this order, and every wait in it is bounded by the write's Deadline:

  0) ``start_write(engine, plan, sink, strategy, deadline, held)`` (select.py, the one place
     an implementation is chosen) builds and starts it; ``select.staging_chunks()``, asked
     before, says how many staging chunks it will draw (from the class's ``stages()``), and
     the owner grows the engine's pool by that much first. Not held: the copy starts at once. Held (layer-wise):
     nothing is read until released. ``save()`` returns after this step.
  1) ``release(records)`` / ``release_all()``: a held write starts reading these records.
     Any thread, any order, idempotent; a no-op once everything is copied.
  2) ``wait_records(records, timeout)`` / ``wait_copied(timeout) -> bool``: True once those
     records' tensors are no longer read (the gate: the caller may overwrite them). They
     release what they wait for. False when the caller's `timeout` passed first; raises the
     write's error, or WriteStalled when nothing moved for the deadline. "Copied" is reached
     by the write's own workers: it never needs step 3.
  3) ``finish() -> WriteResult``: once, on the commit thread: releases everything, waits
     until every data byte is durable in the sink and, for file sinks, the headers are
     written and the file fdatasync'ed (mapped sinks return the header in
     ``result.blobs`` for the store to place). Raises as step 2.
  4) ``abort(error) -> bool``: at any point, from any thread, idempotent: fails the write
     with `error` (raised by later waits and by finish), stops its workers, and returns True
     once none of them reads the caller's tensors or touches the sink — False when one is
     still stuck after the deadline (it is then logged, and the engine is kept alive).

``bytes_written`` is the data written so far; ``mode`` says how the bytes move; ``timings()``
where its time went so far (fastckpt.timings names the phases), read at any point.

Strategies (LightCheck §III-A): ``c`` copies into staging (host: bounded 4096-aligned chunks;
CUDA: pinned chunks filled on a side stream) that writers drain while later chunks are
still copying; ``g`` first copies everything into spare memory of the tensors' device (on
the host: a second host copy), so the gate waits only for that copy; ``d`` writes from
the live tensors (GDS via kvikio for CUDA when present), so the gate holds until written.
A mapped pool is itself the snapshot's destination: every strategy stores straight into it.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Union

from ..format.plan import FilePlan
from ..timings import Timings

STRATEGIES = ("c", "g", "d")


@dataclass(frozen=True)
class FileSink:
    """A file at `path`. direct_io: O_DIRECT where the filesystem allows it.
    gds: CUDA tensors with strategy 'd' go through kvikio (GDS, or its compat mode) when installed."""

    path: str
    direct_io: bool = True
    gds: bool = True
    kind = "file"


@dataclass(frozen=True)
class MemoryFileSink(FileSink):
    """A file on a memory filesystem (tmpfs: a memory tier's part), written as any file is (by the
    strategy: staged, host copy, direct) but its bytes stored through one mapping of it, its
    pages faulted in once, instead of write(): on tmpfs a write() costs the kernel a page lookup
    and lock per 4 KiB on top of the copy. CUDA tensors are written to it as to any file."""

    direct_io: bool = False
    kind = "memory"


@dataclass(frozen=True)
class MappedSink:
    """The data extent of a pool version: file offset `plan.data_begin` lands at pool offset `data_off`."""

    pool: object  # fastckpt.pmem.pool.Pool
    data_off: int
    kind = "mapped"


Sink = Union[FileSink, MemoryFileSink, MappedSink]


@dataclass
class WriteResult:
    """What a finished write reports for its commit record."""

    path: str
    bytes: int
    file_crc: int
    record_crcs: list[int]
    spans: list[tuple[int, int, int, int]]  # (record, file offset, length, crc)
    direct_io: bool  # some data went through O_DIRECT
    names: list[str] = field(default_factory=list)  # record names, by index
    blobs: list[tuple[int, bytes]] = field(default_factory=list)  # headers (placed by the store for mapped sinks)
    direct_io_refused: bool = False  # O_DIRECT was asked for and the kernel refused it: written buffered
    etag: str = ""  # set by an object store once the part is uploaded: its object's ETag


class SnapshotWrite(abc.ABC):
    """One write in flight; see the module docstring for the order of calls."""

    mode: str = ""

    @classmethod
    @abc.abstractmethod
    def stages(cls, strategy: str, gds: bool = True) -> bool:
        """Whether a write with this strategy draws the engine's staging chunks (one per chunk
        of the plan's data extent: select.staging_chunks); gds is FileSink.gds."""

    @abc.abstractmethod
    def release(self, records) -> None:
        """(1) A held write starts reading these records (indices into plan.records)."""

    @abc.abstractmethod
    def release_all(self) -> None:
        """(1) Everything is released."""

    @abc.abstractmethod
    def wait_records(self, records, timeout: float | None = None) -> bool:
        """(2) True once these records' tensors are no longer read."""

    @abc.abstractmethod
    def wait_copied(self, timeout: float | None = None) -> bool:
        """(2) True once no tensor of the plan is read any more."""

    @abc.abstractmethod
    def finish(self) -> WriteResult:
        """(3) Durable data (and, for files, headers); the CRCs."""

    @abc.abstractmethod
    def abort(self, error: BaseException) -> bool:
        """(4) Fails and stops the write; True once no worker of it runs."""

    @property
    @abc.abstractmethod
    def bytes_written(self) -> int:
        """Data bytes in the sink so far."""

    def copied(self) -> bool:
        """True once no tensor of the plan is read any more (does not wait)."""
        return self.wait_copied(0.0)

    @property
    def clock(self) -> Timings:
        """The phases this write's Python side timed (made on first use)."""
        clock = self.__dict__.get("_clock")
        if clock is None:
            clock = self.__dict__.setdefault("_clock", Timings())
        return clock

    def timings(self) -> dict[str, float]:
        """Seconds per phase so far, and the instants copied_at / written_at as time.monotonic()
        values (fastckpt.timings): what the Python side timed and what its native job timed."""
        merged = Timings()
        merged.take(self.clock.as_dict())
        merged.take(self._native_timings())
        return merged.as_dict()

    def _native_timings(self) -> dict[str, float]:
        """What this write's native job timed (WriteJob.timings()); none by default."""
        return {}

    def _let_go(self) -> None:
        """Finished, or aborted with every worker stopped: the engine is no longer needed, and a
        Pending kept by the caller must not keep a closed Checkpointer's engine (and threads) alive."""
        self.engine = None


def chunks_of(plan: FilePlan, chunk_bytes: int) -> int:
    """Staging chunks covering the plan's data extent."""
    n = plan.data_end - plan.data_begin
    return -(-n // chunk_bytes) if n > 0 and any(r.nbytes for r in plan.records) else 0
