"""Staging memory as a Checkpointer uses it: the engine's chunk pool, grown per write within a bound.

Owns sizing (a write draws what select.staging_chunks says its implementation draws; the
pool holds at most `concurrency` checkpoints' worth — or `staging_mb` — and never more than
half the RAM), growing on demand (the first save faults in one checkpoint's worth, more only
when saves really overlap), pinning every chunk for CUDA copies, faulting staging in on a
background thread ahead of the first save (reserve), and releasing it all at close. A pool
whose chunks a stuck write still holds is left allocated (and said so in the log).
"""
from __future__ import annotations

import logging
import math
import threading

from ..engine import MiB, physical_memory
from .job_write import stuck_on
from .pinning import pin_chunks, unpin_chunks

log = logging.getLogger("fastckpt")


class Staging:
    """The staging chunks of one engine."""

    def __init__(self, engine, concurrency: int, staging_mb: int | None, policy: str):
        self.engine, self.concurrency, self.staging_mb, self.policy = engine, concurrency, staging_mb, policy
        self.pool = engine.pool
        self.pinned = False
        self._reserving: threading.Thread | None = None
        self._closed = False

    def bound(self, need: int) -> int:
        """Chunks the pool may hold, for writes of `need` chunks each."""
        if self.staging_mb is None:
            return min(self.concurrency * need, max(1, physical_memory() // 2 // self.pool.chunk_bytes))
        return max(1, self.staging_mb * MiB // self.pool.chunk_bytes)

    def grow(self, n: int) -> None:
        new = self.pool.grow(n)
        self.pinned = pin_chunks(new, self.pool.chunk_bytes) or self.pinned

    def ensure(self, need: int) -> bool:
        """Grows the pool for a write of `need` chunks, within the bound; False when
        policy='skip' and too few chunks are free now."""
        if need <= 0:
            return True
        grow = min(self.bound(need) - self.pool.capacity, need - self.pool.free_count)
        if grow > 0:
            self.grow(grow)
        return self.policy == "wait" or self.pool.free_count >= min(need, self.pool.capacity)

    def reserve(self, nbytes: int) -> None:
        """Faults in one checkpoint's worth (of about nbytes) on a background thread, so that
        the first save does not pay for it (page faults run at ~1-3 GB/s) on the training
        thread. A save that comes first simply grows what is still missing."""
        if self._reserving is not None:
            return
        need = max(1, math.ceil(nbytes / self.pool.chunk_bytes))
        target = min(need, self.bound(need))

        def fault_in() -> None:
            while not self._closed and self.pool.capacity < target:
                self.grow(1)

        self._reserving = threading.Thread(target=fault_in, name="fastckpt-reserve", daemon=True)
        self._reserving.start()

    def close(self) -> bool:
        """Unpins and frees every chunk; False (nothing freed) while a stuck write holds one."""
        self._closed = True
        if self._reserving is not None:
            self._reserving.join()
        if stuck_on(self.engine):
            log.error("fastckpt: staging memory stays allocated: a stuck write still holds some of it")
            return False
        unpin_chunks(self.pool.addresses())
        self.pool.free_all()
        return True
