"""Page-locking host memory for CUDA copies: staging chunks and mapped pools.

Owns cudaHostRegister / cudaHostUnregister on memory the native core allocated or mapped,
so device-to-host copies into it run asynchronously at full speed. Each registered range
is remembered by its base address: a range is registered once per process and unregistered
once. Everything here is a no-op without CUDA.
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger("fastckpt")
_registered: dict[int, bool] = {}  # base address -> registered with CUDA


def register(base: int, nbytes: int, what: str) -> bool:
    """cudaHostRegister on [base, base + nbytes), once; False without CUDA or when refused."""
    if base not in _registered:
        if not torch.cuda.is_available():
            return False
        err = int(torch.cuda.cudart().cudaHostRegister(base, nbytes, 0))
        _registered[base] = err == 0
        if err:
            log.warning("fastckpt: cudaHostRegister of %s failed (error %d); copies into it go "
                        "through pageable memory", what, err)
    return _registered[base]


def unregister(base: int) -> None:
    if _registered.pop(base, False):
        torch.cuda.cudart().cudaHostUnregister(base)


def pin_chunks(addresses: list[int], nbytes: int) -> bool:
    """Registers staging chunks; True when every one of them is page-locked."""
    if not addresses or not torch.cuda.is_available():
        return False
    return all([register(a, nbytes, "a staging chunk") for a in addresses])


def unpin_chunks(addresses: list[int]) -> None:
    for a in addresses:
        unregister(a)
