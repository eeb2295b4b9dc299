"""Activation offload to SSD (Fastensor §3): saved activations leave memory during forward.

    with ActivationOffload("/ssd/tmp", threshold_mb=1):
        loss = model(x)
        loss.backward()          # inside the block: its end removes this step's files

The plugins split that in three: start() and hooks() around the forward, close() once the
step (backward included) is over or has failed.

Owns a torch.autograd.graph.saved_tensors_hooks pair. pack: a saved tensor of at least
`threshold_mb` (not a Parameter) is handed to background writers (TensorIO: any tool, or
the adaptive choice) and autograd keeps only a handle; writes in flight are bounded by
`max_inflight_mb` (pack waits for the oldest). unpack: backward asks for handles in
reverse order; each read also starts reads of the next `prefetch` handles in that order,
and a file is deleted as soon as it is read. close() (the end of the with-block, or of
the step in the plugins) removes whatever is left, also when the step raised.
"""
from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from ..errors import ConfigError
from .adaptive import TensorIO

_ids = itertools.count()


class _Handle:
    __slots__ = ("key", "path", "device", "nbytes", "written", "read")

    def __init__(self, key: int, path: str, device: torch.device, nbytes: int):
        self.key, self.path, self.device, self.nbytes = key, path, device, nbytes
        self.written: Future | None = None
        self.read: Future | None = None


class ActivationOffload:
    def __init__(self, directory: str | None = None, threshold_mb: float = 1.0, io: TensorIO | None = None,
                 max_inflight_mb: float = 256.0, prefetch: int = 2, writers: int = 2):
        if threshold_mb < 0 or max_inflight_mb <= 0 or prefetch < 0 or writers < 1:
            raise ConfigError("threshold_mb >= 0, max_inflight_mb > 0, prefetch >= 0 and writers >= 1 are required")
        base = directory or tempfile.gettempdir()
        if not os.path.isdir(base):
            raise FileNotFoundError(f"offload directory {base!r} does not exist")
        self.base, self.threshold = base, int(threshold_mb * (1 << 20))
        self.max_inflight, self.prefetch = int(max_inflight_mb * (1 << 20)), prefetch
        self.io = io or TensorIO(mode="aware", aware="wr")
        self._writers = writers
        self._pool: ThreadPoolExecutor | None = None
        self._dir: str | None = None
        self._lock = threading.Condition()
        self._inflight = 0
        self._order: list[_Handle] = []  # pack order
        self._pending_writes: deque = deque()
        self._hooks = None
        self.stats = {"offloaded": 0, "bytes": 0, "kept": 0, "peak_inflight": 0, "prefetched": 0}

    # -- the context -------------------------------------------------------------
    def __enter__(self) -> "ActivationOffload":
        self.start()
        self._hooks = self.hooks()
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        hooks, self._hooks = self._hooks, None
        try:
            if hooks is not None:
                hooks.__exit__(*exc)
        finally:
            self.close()

    def hooks(self):
        """The pack/unpack hooks alone, as a context manager (tensors saved inside it offload)."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def start(self) -> None:
        """Opens this step's directory and writers (the plugins call it; the with-block does)."""
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix=f"fastckpt-act-{os.getpid()}-", dir=self.base)
            self.io.candidates(self._dir)  # probe the tools once, before writer threads race to
            self._pool = ThreadPoolExecutor(self._writers, thread_name_prefix="fastckpt-offload")

    def close(self) -> None:
        """Waits for writes and reads in flight, then removes every file of this step."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        with self._lock:
            self._order, self._inflight = [], 0
            self._pending_writes.clear()

    # -- the hooks ---------------------------------------------------------------
    def _pack(self, t: torch.Tensor):
        nbytes = t.numel() * t.element_size()
        if (nbytes < self.threshold or isinstance(t, torch.nn.Parameter) or t.layout != torch.strided
                or self._pool is None):
            self.stats["kept"] += 1
            return t
        h = _Handle(next(_ids), os.path.join(self._dir, f"{len(self._order)}.fct"), t.device, nbytes)
        with self._lock:
            while self._inflight + nbytes > self.max_inflight and self._pending_writes:
                oldest = self._pending_writes[0]
                self._lock.release()
                try:
                    oldest.written.result()
                finally:
                    self._lock.acquire()
            self._inflight += nbytes
            self.stats["peak_inflight"] = max(self.stats["peak_inflight"], self._inflight)
            self._order.append(h)
            h.written = self._pool.submit(self._write, h, t)  # holds t only until it is written
            self._pending_writes.append(h)
        self.stats["offloaded"] += 1
        self.stats["bytes"] += nbytes
        return h

    def _write(self, h: _Handle, t: torch.Tensor) -> None:
        try:
            self.io.save(t.detach(), h.path)
        finally:
            with self._lock:
                self._inflight -= h.nbytes
                if h in self._pending_writes:
                    self._pending_writes.remove(h)
                self._lock.notify_all()

    def _read(self, h: _Handle) -> torch.Tensor:
        h.written.result()
        t = self.io.load(h.path, device=h.device)
        os.unlink(h.path)
        return t

    def _unpack(self, packed):
        if not isinstance(packed, _Handle):
            return packed
        with self._lock:
            idx = self._order.index(packed) if packed in self._order else -1
            for later in self._order[max(0, idx - self.prefetch):idx][::-1]:  # backward goes in reverse
                if later.read is None and self._pool is not None:
                    later.read = self._pool.submit(self._read, later)
                    self.stats["prefetched"] += 1
            if packed.read is None:
                packed.read = self._pool.submit(self._read, packed) if self._pool is not None else None
        return packed.read.result() if packed.read is not None else self._read(packed)
