"""The write path: live tensors -> staging or spare memory -> a file or a pool version.

  protocol.py      the protocol every write follows, its call order, sinks and result
  select.py        the one place an implementation is chosen (source x sink)
  host_file.py     host tensors -> file          (native job: staged, host copy, direct; a tmpfs
                   file, MemoryFileSink, is stored into through a mapping of it)
  host_mapped.py   host tensors -> mapped pool   (native job: copy threads store into it)
  device_file.py   CUDA tensors -> file          (side stream, pinned staging, spare memory, kvikio)
  device_mapped.py CUDA tensors -> mapped pool   (side stream into the registered mapping)
  job_write.py, device_write.py, streams.py, pinning.py, gds.py   what those share
  concurrency.py   at most `concurrency` saves at once: the slots a Checkpointer and FastStager draw
  deadline.py      every wait bounded: no progress for stall_timeout_s -> WriteStalled
  gate.py          the optimizer-step gate that waits for the copies
  layerwise.py     held snapshots released per DDP bucket (LightCheck §III-B)
  watch.py         SnapshotWatch (a tensor written in place before its copy: a torn snapshot) and Trust
  staging.py       a Checkpointer's staging: grown in the background, bounded by staging_mb
  native_engine.py the native engine (copy and writer threads, staging chunks) a write runs on
"""
from .deadline import Deadline, WriteStalled
from .protocol import STRATEGIES, FileSink, MappedSink, MemoryFileSink, SnapshotWrite, WriteResult
from .select import implementation, reads_through_stream, staging_chunks, stages, start_write

__all__ = ["Deadline", "WriteStalled", "STRATEGIES", "FileSink", "MappedSink", "MemoryFileSink", "SnapshotWrite", "WriteResult",
           "implementation", "reads_through_stream", "staging_chunks", "stages", "start_write"]
