"""How FastStager copies one leaf of a state dict: a torch.Tensor or a DTensor (its local shard).

The buffers are whole-tensor staging (fastckpt.write.snapshot_buffers). `copy_leaf` fills a
leaf's buffer; `staged_like` hands the copy back as the leaf was (a DTensor keeps its sharding,
its local shard on the host for a CUDA DTensor, as DCP's own CPU staging makes it).
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import _native
from ..machine import hardware_threads
from ..write.gate import local_tensor

STREAMED = 1 << 20  # host tensors from this size are copied by the native streaming copy

__all__ = ["copy_leaf", "is_dtensor", "local_tensor", "sharded_tensor", "staged_like"]


def is_dtensor(t) -> bool:
    return isinstance(t, torch.Tensor) and local_tensor(t) is not t


def sharded_tensor(t) -> bool:
    """A ShardedTensor (FSDP1's sharded state dict), which FastStager does not stage."""
    return type(t).__name__ == "ShardedTensor"


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
    elif (local.device.type == "cpu" and local_buf.device.type == "cpu" and local.dtype == local_buf.dtype
          and local.is_contiguous() and local_buf.is_contiguous() and local.nbytes == local_buf.nbytes
          and local.nbytes >= STREAMED and not local.is_conj() and not local.is_neg()):
        # a large host tensor: streamed past the cache into its buffer, which a writer's DMA
        # reads next (native copy_parallel); a third faster than copy_ on this project's VM
        _native.copy(local_buf.data_ptr(), local.data_ptr(), local.nbytes, hardware_threads())
    else:
        local_buf.copy_(local)
