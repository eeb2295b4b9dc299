"""The one place a write implementation is chosen: the plan's source x the sink.

              file sink          memory file sink (tmpfs)   mapped sink (pmem pool)
  host        HostFileWrite      HostFileWrite              HostMappedWrite
  stream      DeviceFileWrite    DeviceFileWrite            DeviceMappedWrite

A plan is read through a stream when its device type has one in streams.STREAMS (CUDA
does); every other plan is read by the host implementations. kvikio is an option of the
file sink (FileSink.gds), used by DeviceFileWrite for strategy d.
"""
from __future__ import annotations

from ..format.plan import FilePlan
from .deadline import Deadline
from .device_file import DeviceFileWrite
from .device_mapped import DeviceMappedWrite
from .host_file import HostFileWrite
from .host_mapped import HostMappedWrite
from .protocol import STRATEGIES, Sink, SnapshotWrite, chunks_of
from .streams import STREAMS, device_type

IMPLEMENTATIONS: dict[tuple[str, str], type[SnapshotWrite]] = {
    ("host", "file"): HostFileWrite, ("host", "memory"): HostFileWrite, ("host", "mapped"): HostMappedWrite,
    ("stream", "file"): DeviceFileWrite, ("stream", "memory"): DeviceFileWrite, ("stream", "mapped"): DeviceMappedWrite,
}


def implementation_for(device: str, sink_kind: str) -> type[SnapshotWrite]:
    """The class that writes tensors of this device type into a sink of this kind ("file", "memory" or "mapped")."""
    source = "stream" if device in STREAMS else "host"
    return IMPLEMENTATIONS[(source, sink_kind)]


def implementation(plan: FilePlan, sink_kind: str) -> type[SnapshotWrite]:
    return implementation_for(device_type(plan), sink_kind)


def reads_through_stream(plan: FilePlan) -> bool:
    """Whether the plan's tensors are read through a side stream (on CUDA: copies the host does not make)."""
    return device_type(plan) in STREAMS


def stages(device: str, sink_kind: str, strategy: str, gds: bool = True) -> bool:
    """Whether writes of tensors on `device` with this strategy draw staging chunks."""
    return implementation_for(device, sink_kind).stages(strategy, gds)


def staging_chunks(plan: FilePlan, sink_kind: str, strategy: str, chunk_bytes: int, gds: bool = True) -> int:
    """Staging chunks the write of `plan` will draw (one per chunk of its data): grow the
    engine's pool by this first."""
    return chunks_of(plan, chunk_bytes) if implementation(plan, sink_kind).stages(strategy, gds) else 0


def start_write(engine, plan: FilePlan, sink: Sink, strategy: str, deadline: Deadline,
                held: bool = False) -> SnapshotWrite:
    """Step 0 of the protocol (protocol.py): the write of `plan` into `sink`, started."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of: {', '.join(STRATEGIES)}")
    return implementation(plan, sink.kind)(engine, plan, sink, strategy, deadline, held)
