"""Host tensors into a mapped pool version (LightCheck-D / Portus zero-copy, CPU side).

Copy threads store the live tensors straight into the version's data extent and compute
each span's CRC in the same pass; persisting is the fence on the copy thread (real PMEM) or
an msync on a writer. No staging: the pool is the snapshot's destination, whatever the
strategy. finish() returns the safetensors header in `blobs` for the pool store to place.
"""
from __future__ import annotations

from .job_write import JobWrite
from .protocol import MappedSink, WriteResult


class HostMappedWrite(JobWrite):
    """One pool version of host tensors in flight."""

    mode = "mapped"

    @classmethod
    def stages(cls, strategy: str, gds: bool = True) -> bool:
        return False

    def __init__(self, engine, plan, sink: MappedSink, strategy: str, deadline, held: bool = False):
        if plan.format != "safetensors":
            raise ValueError("a pool keeps safetensors images")
        super().__init__(engine, plan, deadline, f"{sink.pool.path} at offset {sink.data_off}", held)
        self.sink = sink
        pieces = [(r.storage.data_ptr(), r.nbytes, r.file_off, i) for i, r in enumerate(plan.records) if r.nbytes]
        shift = (sink.data_off - plan.data_begin) % (1 << 64)
        self._job = engine.submit_mapped(sink.pool.native, shift, pieces, plan.data_begin, plan.data_end,
                                         len(plan.records), held)

    def finish(self) -> WriteResult:
        self._wait_written()
        crcs = list(self._job.record_crcs())
        blobs, image_crc = self.plan.finish(crcs)
        self._let_go()
        return WriteResult(self.where, self.plan.file_size, image_crc, crcs,
                           [tuple(s) for s in self._job.span_crcs()], False,
                           [r.name for r in self.plan.records], blobs)
