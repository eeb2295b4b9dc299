"""Whole-tensor staging: a snapshot's tensors copied each into a buffer of its own, reused from
snapshot to snapshot — the staging a DCP async_save hands on as a state dict (fastckpt.dcp.stager).

The Checkpointer's staging (staging.py) streams a checkpoint's bytes through the native
engine's fixed-size chunks; a DCP snapshot must instead be tensors shaped like the state it
copies, which DCP's planner then resolves item by item, so it is staged here. Owns one
snapshot place's buffers: for each tensor leaf (by index in the flattened state) a buffer of
its own, reused by the next snapshot of the same structure and replaced where a leaf's shape,
dtype or device changed. Host buffers start page-aligned and are each a storage of its own, so
a writer can write them as they are (O_DIRECT, no second copy); one for a CUDA tensor is
page-locked (CUDA's pinned host allocator: freed, and unlocked, with the tensor), any other
memory as the native staging's (2 MiB-aligned, huge pages), or plain pages where no O_DIRECT
write reads them (direct_io=False). `device_copy` (strategy 'g') keeps a CUDA tensor's copy in
spare memory of its own device. `holds(address)` says whether a storage is one of these buffers: the owner of
the buffers answers a writer that asks it, and no one else keeps such a list.
"""
from __future__ import annotations

import mmap

import torch

from .. import _native


def host_buffer(nbytes: int, pin: bool, direct_io: bool = True) -> torch.Tensor:
    """nbytes of page-aligned host memory as a uint8 tensor that is its storage's only view:
    page-locked by CUDA's own host allocator for a CUDA source, else the memory O_DIRECT moves
    fastest (native io_memory.h: aligned to 2 MiB and advised for huge pages; a write from 4 KiB
    pages went at 0.6x the speed on this project's virtio disk: a DCP save from them was
    durable at 0.5x the disk's bound). direct_io=False: a plain anonymous mapping (page-aligned),
    for buffers no O_DIRECT write reads: faulted in faster where huge pages come slowly (on
    this project's VM, 0.5 GB/s beyond the first few hundred MiB of them)."""
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    if pin:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    if direct_io:
        region = _native.IoMemory(nbytes)  # 2 MiB-aligned, huge pages where the kernel has them
    else:
        region = mmap.mmap(-1, nbytes)
    return torch.frombuffer(region, dtype=torch.uint8, count=nbytes)  # keeps the memory alive


class SnapshotBuffers:
    """One snapshot place's buffers, by leaf index."""

    def __init__(self, device_copy: bool, direct_io: bool = True):
        self.device_copy = device_copy
        self.direct_io = direct_io  # host buffers an O_DIRECT write reads (host_buffer)
        self._bufs: dict[int, torch.Tensor] = {}  # leaf index -> the buffer (the leaf's shape, dtype)
        self._addresses: set[int] = set()  # their storages' addresses
        self.allocated = 0  # bytes
        self.made = 0  # buffers allocated so far (reuse keeps this at one per leaf)

    def for_leaf(self, i: int, local: torch.Tensor) -> torch.Tensor:
        """The buffer for leaf i, whose values are `local` (a plain tensor: a DTensor's local
        shard), made or remade to fit it."""
        device = local.device if (self.device_copy and local.device.type != "cpu") else torch.device("cpu")
        buf = self._bufs.get(i)
        if buf is not None and buf.shape == local.shape and buf.dtype == local.dtype and buf.device == device:
            return buf
        if buf is not None:
            self._drop(i)
        if device.type == "cpu":
            raw = host_buffer(local.numel() * local.element_size(), pin=local.device.type == "cuda",
                              direct_io=self.direct_io)
            buf = raw.view(local.dtype).view(local.shape) if local.numel() else \
                torch.empty(local.shape, dtype=local.dtype)
        else:
            buf = torch.empty(local.shape, dtype=local.dtype, device=device)
        self._bufs[i] = buf
        self._addresses.add(buf.untyped_storage().data_ptr())
        self.made += 1
        self.allocated += buf.numel() * buf.element_size()
        return buf

    def holds(self, address: int) -> bool:
        """Whether the storage at `address` is one of these buffers."""
        return address in self._addresses

    def keep_only(self, n: int) -> None:
        """Drops the buffers of leaves past the first n (the state got smaller)."""
        for i in [i for i in self._bufs if i >= n]:
            self._drop(i)

    def _drop(self, i: int) -> None:
        buf = self._bufs.pop(i)
        self.allocated -= buf.numel() * buf.element_size()
        self._addresses.discard(buf.untyped_storage().data_ptr())

    def forget(self) -> None:
        """The buffers are left to whoever still references them: no longer this place's."""
        self._bufs.clear()
        self._addresses.clear()
        self.allocated = 0

    def free(self) -> None:
        for i in list(self._bufs):
            self._drop(i)
