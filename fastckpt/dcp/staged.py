"""The memory FastStager copies a snapshot into, and which storages hold a staged snapshot.

Owns one slot's buffers: for each tensor leaf of a state dict (a torch.Tensor, or a DTensor's
local shard) a buffer of its own, reused by the next snapshot of the same structure and
replaced where a leaf's shape, dtype or device changed. Host buffers start page-aligned and are
each a storage of its own: FastStorageWriter writes them as they are (O_DIRECT, no second copy).
A host buffer for a CUDA tensor is page-locked (CUDA's pinned host allocator); any other is an
anonymous mapping.
Strategy 'g' keeps a CUDA tensor's copy in spare memory of its own device (a host tensor's is
a host buffer either way). `copy_leaf` fills one buffer.

The process-wide registry says which storages are staged (`staged_slot`): FastStorageWriter
writes those straight from memory, and asks the slot whether the snapshot came out whole.
"""
from __future__ import annotations

import mmap
import threading
import weakref
from typing import Optional

import torch

from ..write.gate import local_tensor

_registry: dict[int, "weakref.ref"] = {}  # storage address -> the slot whose snapshot it holds
_registry_lock = threading.Lock()


def is_dtensor(t) -> bool:
    return isinstance(t, torch.Tensor) and local_tensor(t) is not t


def sharded_tensor(t) -> bool:
    """A ShardedTensor (FSDP1's sharded state dict), which FastStager does not stage."""
    return type(t).__name__ == "ShardedTensor"


def register(storage_ptr: int, slot) -> None:
    with _registry_lock:
        _registry[storage_ptr] = weakref.ref(slot)


def unregister(storage_ptr: int, slot) -> None:
    with _registry_lock:
        ref = _registry.get(storage_ptr)
        if ref is not None and ref() in (slot, None):
            del _registry[storage_ptr]


def staged_slot(t: torch.Tensor):
    """The FastStager slot whose snapshot (staged now) holds this tensor's memory, or None."""
    if not isinstance(t, torch.Tensor) or t.device.type == "meta":
        return None
    with _registry_lock:
        ref = _registry.get(local_tensor(t).untyped_storage().data_ptr())
    slot = ref() if ref is not None else None
    return slot if slot is not None and slot.busy else None


def host_buffer(nbytes: int, pin: bool) -> torch.Tensor:
    """nbytes of page-aligned host memory as a uint8 tensor that is its storage's only view:
    page-locked by CUDA's own host allocator for a CUDA source (freed, and unlocked, with the
    tensor), else an anonymous mapping."""
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    if pin:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    region = mmap.mmap(-1, nbytes)
    return torch.frombuffer(region, dtype=torch.uint8, count=nbytes)  # keeps the mapping alive


class Buffers:
    """One slot's buffers, by leaf index; `owner` is the slot, for the registry."""

    def __init__(self, owner, device_copy: bool):
        self.owner = owner
        self.device_copy = device_copy  # strategy 'g': a CUDA leaf's copy stays on its device
        self._bufs: dict[int, torch.Tensor] = {}  # leaf index -> the local buffer (shape, dtype)
        self.allocated = 0  # bytes
        self.made = 0  # buffers allocated so far (reuse keeps this at one per leaf)

    def for_leaf(self, i: int, src: torch.Tensor) -> torch.Tensor:
        """The buffer for leaf i (its local values), made or remade to fit src."""
        local = local_tensor(src)
        device = local.device if (self.device_copy and local.device.type != "cpu") else torch.device("cpu")
        buf = self._bufs.get(i)
        if buf is not None and buf.shape == local.shape and buf.dtype == local.dtype and buf.device == device:
            return buf
        if buf is not None:
            self._drop(i)
        if device.type == "cpu":
            raw = host_buffer(local.numel() * local.element_size(), pin=local.device.type == "cuda")
            buf = raw.view(local.dtype).view(local.shape) if local.numel() else \
                torch.empty(local.shape, dtype=local.dtype)
        else:
            buf = torch.empty(local.shape, dtype=local.dtype, device=device)
        self._bufs[i] = buf
        self.made += 1
        self.allocated += buf.numel() * buf.element_size()
        register(buf.untyped_storage().data_ptr(), self.owner)
        return buf

    def keep_only(self, n: int) -> None:
        """Drops the buffers of leaves past the first n (the state got smaller)."""
        for i in [i for i in self._bufs if i >= n]:
            self._drop(i)

    def _drop(self, i: int) -> None:
        buf = self._bufs.pop(i)
        self.allocated -= buf.numel() * buf.element_size()
        unregister(buf.untyped_storage().data_ptr(), self.owner)

    def forget(self) -> None:
        """The buffers are left to whoever still references them: no longer staged here."""
        for buf in self._bufs.values():
            unregister(buf.untyped_storage().data_ptr(), self.owner)
        self._bufs.clear()
        self.allocated = 0

    def free(self) -> None:
        for i in list(self._bufs):
            self._drop(i)


def staged_like(src: torch.Tensor, local_buf: torch.Tensor) -> torch.Tensor:
    """A new tensor object over local_buf's memory, shaped as src: a DTensor with src's sharding
    (its local shard in the buffer; on the host for a CUDA DTensor, as DCP's own CPU staging
    makes it), else a plain tensor. New objects each time: the slot is free once they are gone."""
    view = local_buf.detach()
    if is_dtensor(src):
        from torch.distributed.tensor import DTensor
        return DTensor(view, src._spec, requires_grad=False)
    return view


def copy_leaf(src: torch.Tensor, local_buf: torch.Tensor, stream: Optional[object] = None) -> None:
    """Copies src's local values into its buffer (on `stream` for a CUDA source: asynchronous;
    the caller synchronizes the stream)."""
    local = local_tensor(src).detach()
    if stream is not None and local.device.type == "cuda":
        with torch.cuda.stream(stream):
            local_buf.copy_(local, non_blocking=True)
    else:
        local_buf.copy_(local)
