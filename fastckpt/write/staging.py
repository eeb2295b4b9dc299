"""Staging memory as a Checkpointer uses it: the engine's chunk pool, grown per write within a bound.

Owns sizing (a write draws what select.staging_chunks says its implementation draws; the
pool holds at most `concurrency` checkpoints' worth — or `staging_mb` — and never more than
half the RAM), growing on demand (the first save needs one checkpoint's worth, more only
when saves really overlap), pinning every chunk for CUDA copies, and releasing it all at
close. A pool whose chunks a stuck write still holds is left allocated (and said so in the log).

Growing never runs on the training thread (policy='wait'): faulting in and pinning a
checkpoint's worth takes seconds (page faults run at ~1-3 GB/s), so one background thread
grows the pool chunk by chunk toward its target — ahead of the first save when the owner
knows the size (reserve), else from the save that finds staging short. A write draws chunks
as they appear (its writers hand them back as they go), and Checkpointer sends a CUDA save
that finds staging short through spare device memory meanwhile (`short`). policy='skip'
grows at once: it must know now whether the chunks are there.
"""
from __future__ import annotations

import logging
import math
import threading

from ..machine import physical_memory
from .native_engine import MiB
from .job_write import stuck_on
from .pinning import pin_chunks, unpin_chunks

log = logging.getLogger("fastckpt")


class Staging:
    """The staging chunks of one engine."""

    def __init__(self, engine, concurrency: int, staging_mb: int | None, policy: str):
        self.engine, self.concurrency, self.staging_mb, self.policy = engine, concurrency, staging_mb, policy
        self.pool = engine.pool
        self.pinned = False
        self._target = 0  # chunks the grower works toward
        self._reserved = False
        self._reserving: threading.Thread | None = None  # the latest grower thread
        self._growing = False  # a grower is working toward _target (changed under _lock)
        self._lock = threading.Lock()
        self._closed = False

    def bound(self, need: int) -> int:
        """Chunks the pool may hold, for writes of `need` chunks each."""
        if self.staging_mb is None:
            return min(self.concurrency * need, max(1, physical_memory() // 2 // self.pool.chunk_bytes))
        return max(1, self.staging_mb * MiB // self.pool.chunk_bytes)

    def grow(self, n: int) -> None:
        new = self.pool.grow(n)
        self.pinned = pin_chunks(new, self.pool.chunk_bytes) or self.pinned

    def target_for(self, need: int) -> int:
        """The capacity a write of `need` chunks asks for: what is in use plus its own, within the bound."""
        return min(self.bound(need), self.pool.capacity - self.pool.free_count + need)

    def short(self, need: int) -> bool:
        """Whether fewer than `need` chunks are free now, while the pool may still grow."""
        return need > 0 and self.pool.free_count < need and self.pool.capacity < self.bound(need)

    def ensure(self, need: int) -> bool:
        """Makes room for a write of `need` chunks, within the bound: grown in the background
        (policy='wait'; the write draws chunks as they come), or now (policy='skip': False
        when too few chunks are free even so)."""
        if need <= 0:
            return True
        target = self.target_for(need)
        if self.policy == "wait":
            self._grow_toward(target)
            return True
        if target > self.pool.capacity:
            self.grow(target - self.pool.capacity)
        return self.pool.free_count >= min(need, self.pool.capacity)

    def reserve(self, nbytes: int) -> None:
        """Faults in one checkpoint's worth (of about nbytes) in the background before the first
        save, once per Staging."""
        if self._reserved:
            return
        self._reserved = True
        need = max(1, math.ceil(nbytes / self.pool.chunk_bytes))
        self._grow_toward(min(need, self.bound(need)))

    def _grow_toward(self, target: int) -> None:
        with self._lock:
            self._target = max(self._target, target)
            if self._closed or self._growing or self.pool.capacity >= self._target:
                return  # nothing to do, or the running grower sees the new target
            self._growing = True
            self._reserving = threading.Thread(target=self._grow_loop, name="fastckpt-reserve", daemon=True)
            self._reserving.start()

    def _grow_loop(self) -> None:
        while True:
            with self._lock:
                if self._closed or self.pool.capacity >= self._target:
                    self._growing = False
                    return
            try:
                self.grow(1)
            except MemoryError:
                log.error("fastckpt: staging memory could not grow past %d chunks; writes go on through "
                          "those", self.pool.capacity)
                with self._lock:
                    self._target = self.pool.capacity
                    self._growing = False
                return

    def wait_grown(self, timeout: float | None = None) -> None:
        """Until the grower has reached its target (tests, and close)."""
        th = self._reserving
        if th is not None:
            th.join(timeout)

    def close(self) -> bool:
        """Unpins and frees every chunk; False (nothing freed) while a stuck write holds one."""
        with self._lock:
            self._closed = True
        self.wait_grown()
        if stuck_on(self.engine):
            log.error("fastckpt: staging memory stays allocated: a stuck write still holds some of it")
            return False
        unpin_chunks(self.pool.addresses())
        self.pool.free_all()
        return True
