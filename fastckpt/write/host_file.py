"""Host tensors into a file: strategies c / g / d over one native job.

  c  copy threads fill bounded staging chunks; writers drain them (pipelined); the gate
     waits for the copies;
  g  a full second host copy first (LightCheck's "spare device memory" is host memory
     here), made while save() runs; the writers then write from it;
  d  writers write straight from the live tensors; the gate holds until written.
A held write (layer-wise, c and d) moves nothing until records are released.
A MemoryFileSink (a file on tmpfs) is written the same way, its bytes stored through a mapping
of the file instead of write() (the native MemoryFileSink), except that c stages nothing: the
store into the mapping is itself the copy the gate waits for (staging first would copy every
byte twice, and on a machine whose cores training fills the second copy is what a step pays).
"""
from __future__ import annotations

import torch

from .. import _native
from .job_write import JobWrite, finalized
from .protocol import FileSink, WriteResult

MODES = {"c": "staged", "g": "host-copy", "d": "direct"}


class HostFileWrite(JobWrite):
    """One file of host tensors in flight."""

    @classmethod
    def stages(cls, strategy: str, gds: bool = True) -> bool:
        return strategy == "c"

    def __init__(self, engine, plan, sink: FileSink, strategy: str, deadline, held: bool = False):
        held = held and strategy != "g"  # g copies everything while save() runs
        super().__init__(engine, plan, deadline, sink.path, held)
        self.sink, self.strategy, self.mode = sink, strategy, MODES[strategy]
        memory = sink.kind == "memory"
        if memory:
            self.mode += " (memory-mapped)"
        self._keep: list[torch.Tensor] = []
        pieces = [(r.storage.data_ptr(), r.nbytes, r.file_off, i) for i, r in enumerate(plan.records) if r.nbytes]
        if strategy == "g":
            with self.clock.phase("copy"):
                pieces = [(self._host_copy(src, n), n, off, i) for src, n, off, i in pieces]
        # c into memory: the store into the mapping is the copy (no staging chunk in between)
        source = _native.Source.Staged if strategy == "c" and not memory else _native.Source.Direct
        self._job = engine.submit(sink.path, pieces, plan.data_begin, plan.data_end, plan.file_size, source,
                                  sink.direct_io and not memory, len(plan.records), held, memory)

    def _host_copy(self, src: int, nbytes: int) -> int:
        buf = torch.empty(nbytes, dtype=torch.uint8)
        _native.copy(buf.data_ptr(), src, nbytes, self.engine.copy_threads)
        self._keep.append(buf)
        return buf.data_ptr()

    def finish(self) -> WriteResult:
        self._wait_released()
        crcs, blobs, file_crc = finalized(self._job, self.plan,
                                          lambda latch, what: self._wait(latch, f"{what} of {self.where}", None))
        self._keep.clear()
        self._let_go()
        return WriteResult(self.sink.path, self.plan.file_size, file_crc, crcs,
                           [tuple(s) for s in self._job.span_crcs()], self._job.used_direct_io,
                           [r.name for r in self.plan.records], blobs, self._job.direct_io_refused)
