"""The copy FastStager makes at stage() when a snapshot cannot be handed on live: one leaf of a
state dict (a torch.Tensor, or a DTensor's local shard) into memory of its own.

`copy_of(leaf, strategy, direct_io)` is that copy, handed back as the leaf was (a DTensor keeps
its sharding, its local shard on the host for a CUDA DTensor under 'c', as DCP's own CPU staging
makes it): a host tensor into page-aligned memory (what O_DIRECT moves fastest, when a
FastStorageWriter writes it), a CUDA tensor into page-locked host memory ('c') or spare memory
of its device ('g').
"""
from __future__ import annotations

import mmap

import torch

from .. import _native
from ..machine import hardware_threads
from ..write.gate import local_tensor

STREAMED = 1 << 20  # host tensors from this size are copied by the native streaming copy

__all__ = ["copy_leaf", "copy_of", "host_buffer", "is_dtensor", "local_tensor", "sharded_tensor"]


def is_dtensor(t: object) -> bool:
    return isinstance(t, torch.Tensor) and local_tensor(t) is not t


def sharded_tensor(t: object) -> bool:
    """A ShardedTensor (FSDP1's sharded state dict), which FastStager does not stage."""
    return type(t).__name__ == "ShardedTensor"


def host_buffer(nbytes: int, pin: bool, direct_io: bool) -> torch.Tensor:
    """nbytes of page-aligned host memory as a uint8 tensor that is its storage's only view:
    page-locked by CUDA's own host allocator for a CUDA source, else the memory O_DIRECT moves
    fastest (native io_memory.h: aligned to 2 MiB and advised for huge pages; a write from 4 KiB
    pages went at 0.6x the speed on a virtio disk). direct_io=False: a plain anonymous mapping
    (page-aligned), faulted in sooner, for a copy no O_DIRECT write reads."""
    if pin:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    region = _native.IoMemory(nbytes) if direct_io else mmap.mmap(-1, nbytes)
    return torch.frombuffer(region, dtype=torch.uint8, count=nbytes)  # keeps the memory alive


def copy_of(leaf: torch.Tensor, strategy: str, direct_io: bool) -> torch.Tensor:
    """A new tensor object over a copy of leaf's local values, shaped as leaf."""
    local = local_tensor(leaf).detach()
    if local.device.type != "cpu" and strategy == "g":
        buf = torch.empty(local.shape, dtype=local.dtype, device=local.device)
    elif local.numel() == 0:
        buf = torch.empty(local.shape, dtype=local.dtype)
    else:
        raw = host_buffer(local.numel() * local.element_size(), pin=local.device.type != "cpu", direct_io=direct_io)
        buf = raw.view(local.dtype).view(local.shape)
    copy_leaf(local, buf)
    if is_dtensor(leaf):
        from torch.distributed.tensor import DTensor
        return DTensor(buf, leaf._spec, requires_grad=False)  # type: ignore[attr-defined]
    return buf


def copy_leaf(local: torch.Tensor, buf: torch.Tensor) -> None:
    """Copies local's values into buf: done when it returns on the host; a CUDA copy is queued
    on the current stream (the caller synchronizes it)."""
    if (local.device.type == "cpu" and buf.device.type == "cpu" and local.dtype == buf.dtype
            and local.is_contiguous() and buf.is_contiguous() and local.nbytes >= STREAMED
            and not local.is_conj() and not local.is_neg()):
        # a large host tensor: streamed past the cache into its buffer, which a writer's DMA
        # reads next (native copy_parallel); a third faster than copy_
        _native.copy(buf.data_ptr(), local.data_ptr(), local.nbytes, hardware_threads())
        return
    buf.copy_(local, non_blocking=local.device.type != "cpu")
