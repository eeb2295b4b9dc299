"""Activation offload to SSD (Fastensor §3): saved activations leave memory during forward.

    with ActivationOffload("/ssd/tmp", threshold_mb=1):
        loss = model(x)
        loss.backward()          # inside the block: its end removes this step's files

The plugins split that in three: start() and hooks() around the forward, close() once the
step (backward included) is over or has failed; with `close_when_used` set, the last use of
the step's last offloaded activation in backward closes the step itself.

Owns a torch.autograd.graph.saved_tensors_hooks pair. pack: a saved tensor of at least
`threshold_mb` (not a Parameter) is handed to background writers (TensorIO: any tool, or
the adaptive choice) and autograd keeps only a handle; a tensor saved twice while alive
(a ReLU's output is also the next Linear's input) is written once and shared. Writes in
flight are bounded by `max_inflight_mb` (pack waits for the oldest). unpack: backward asks
for handles in reverse order; each read also starts reads of the next `prefetch` handles
in that order. After a handle's last use its file is deleted and the reloaded tensor is
no longer held here, so backward's memory shrinks as it goes. close() (the end of the
with-block, or of the step in the plugins) removes whatever is left, also when the step
raised; the first start() also removes step directories left by processes that died (kill -9).
A second backward through the same graph (retain_graph=True) is refused clearly.

release_memory (default on) has glibc hand freed activation-sized buffers back to the system
(malloc_release.py): without it the memory offload frees mostly stays in the process.

What unpack hands back is what pack took: its shape, strides and dtype too (io_tools writes
the storage a transposed, permuted or channels_last tensor lies in as it lies, and rebuilds
a slice with gaps into memory of its strides), so backward computes exactly as without
offload, whatever code path a kernel picks for a layout.

Only what frees memory is written. A saved tensor whose storage lives on anyway stays in
memory (stats["kept_alive_elsewhere"]): a parameter, a view of one (Linear saves weight.t()),
any view of a leaf that needs its gradient (the user holds it); and a storage seen to outlive
its offload — at its first use in backward, with every write done, nothing here holds it, so
someone else does (a buffer, the user's batch, a cache) — is kept from then on, whether it is
that same storage again or the tensor saved at the same place of a later step (its index
among this step's offloadable saves, shape, strides, dtype and device; the newest OUTLIVED_SITES
places are remembered).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ..errors import ConfigError
from .adaptive import TensorIO
from .malloc_release import release_large_frees


class _Handle:
    __slots__ = ("index", "path", "device", "nbytes", "ready", "written", "read", "uses", "used", "original",
                 "site", "__weakref__")

    def __init__(self, index: int, path: str, t: torch.Tensor, site: tuple):
        self.index, self.path, self.device, self.site = index, path, t.device, site
        self.nbytes = t.numel() * t.element_size()
        self.ready = None  # a CUDA event: the forward has produced t
        if t.is_cuda:
            self.ready = torch.cuda.Event()
            self.ready.record()
        self.written: Future | None = None
        self.read: Future | None = None
        self.uses, self.used = 1, 0
        # a live storage means its bytes are still these (with the version in the identity). Not a
        # weakref to t: the Python object autograd hands to pack may die while its storage lives
        # on (the next pack of the same tensor gets a new object), and sharing would then depend
        # on when the write finished
        self.original = StorageWeakRef(t.untyped_storage())


def _identity(t: torch.Tensor) -> tuple:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype,
            t._version)


def _held_by_its_owner(t: torch.Tensor) -> bool:
    """A parameter, or a view of a leaf that needs its gradient (weight.t(), a slice of the
    user's input): whoever owns that leaf keeps its storage alive."""
    if isinstance(t, torch.nn.Parameter):
        return True
    root = t._base if t._base is not None else t
    return root.is_leaf and root.requires_grad


PREFIX = "fastckpt-act-"
OUTLIVED_SITES = 4096  # places remembered (shapes that change from step to step add places)


def _remove_dead_steps(base: str) -> None:
    """Removes PREFIX<pid>-* directories whose process no longer exists."""
    for name in os.listdir(base):
        if not name.startswith(PREFIX):
            continue
        pid = name[len(PREFIX):].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        except PermissionError:
            pass  # alive, someone else's


class ActivationOffload:
    def __init__(self, directory: str | None = None, threshold_mb: float = 1.0, io: TensorIO | None = None,
                 max_inflight_mb: float = 256.0, prefetch: int = 2, writers: int = 2, release_memory: bool = True):
        if threshold_mb < 0 or max_inflight_mb <= 0 or prefetch < 0 or writers < 1:
            raise ConfigError("threshold_mb >= 0, max_inflight_mb > 0, prefetch >= 0 and writers >= 1 are required")
        base = directory or tempfile.gettempdir()
        try:
            os.makedirs(base, exist_ok=True)  # as a Checkpointer makes its root
        except OSError as e:
            raise ConfigError(f"cannot use offload directory {base!r}: {e.strerror}") from None
        self.base, self.threshold = base, int(threshold_mb * (1 << 20))
        self.max_inflight, self.prefetch = int(max_inflight_mb * (1 << 20)), prefetch
        self.io = io or TensorIO()
        self._writers = writers
        self.release_memory = release_memory
        self.close_when_used = False  # the last use in backward of the last activation closes the step
        self._pool: ThreadPoolExecutor | None = None
        self._dir: str | None = None
        self._lock = threading.Condition()
        self._inflight = 0
        self._order: list[_Handle] = []  # distinct handles, in pack order
        self._live: dict[tuple, _Handle] = {}  # identity of a saved tensor -> its handle
        self._pending_writes: deque = deque()
        self._hooks = None
        self._swept = False
        self._sites = 0  # offloadable saves of this step so far (a save's place in its step)
        self._outlived: dict[int, StorageWeakRef] = {}  # storages seen to outlive their offload
        self._outlived_sites: dict[tuple, None] = {}  # the places in a step where that was seen, oldest first
        self.stats = {"offloaded": 0, "shared": 0, "bytes": 0, "kept": 0, "kept_alive_elsewhere": 0,
                      "peak_inflight": 0, "prefetched": 0}

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

    @property
    def active(self) -> bool:
        return self._dir is not None

    @property
    def finished(self) -> bool:
        """Every activation offloaded since start() has had its last use in backward."""
        with self._lock:
            return all(h.used >= h.uses for h in self._order)

    def start(self) -> None:
        """Opens this step's directory and writers (the plugins call it; the with-block does)."""
        if self._dir is None:
            if not self._swept:
                _remove_dead_steps(self.base)
                self._swept = True
                if self.release_memory:
                    release_large_frees(self.threshold)
            self._dir = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=self.base)
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
            self._order, self._live, self._inflight, self._sites = [], {}, 0, 0
            self._pending_writes.clear()
            self._outlived = {k: ref for k, ref in self._outlived.items() if not ref.expired()}

    # -- the hooks ---------------------------------------------------------------
    def _pack(self, t: torch.Tensor):
        nbytes = t.numel() * t.element_size()
        if nbytes < self.threshold or t.layout != torch.strided or self._pool is None:
            self.stats["kept"] += 1
            return t
        site = (self._sites, tuple(t.shape), tuple(t.stride()), t.dtype, t.device)
        self._sites += 1
        if self._alive_elsewhere(t, site):
            self.stats["kept"] += 1
            self.stats["kept_alive_elsewhere"] += 1
            return t
        ident = _identity(t)
        with self._lock:
            seen = self._live.get(ident)
            if seen is not None and not seen.original.expired() and seen.used == 0:
                seen.uses += 1
                self.stats["shared"] += 1
                return seen
            while self._inflight + nbytes > self.max_inflight and self._pending_writes:
                oldest = self._pending_writes[0]
                self._lock.release()
                try:
                    oldest.written.result()
                finally:
                    self._lock.acquire()
            h = _Handle(len(self._order), os.path.join(self._dir, f"{len(self._order)}.fct"), t, site)
            self._inflight += nbytes
            self.stats["peak_inflight"] = max(self.stats["peak_inflight"], self._inflight)
            self._order.append(h)
            self._live[ident] = h
            h.written = self._pool.submit(self._write, h, [t])  # holds t only until it is written
            self._pending_writes.append(h)
        self.stats["offloaded"] += 1
        self.stats["bytes"] += nbytes
        return h

    def _alive_elsewhere(self, t: torch.Tensor, site: tuple) -> bool:
        """Whether t's storage lives on without autograd's saved tensors (then writing it frees nothing)."""
        if _held_by_its_owner(t):
            return True
        with self._lock:
            seen = self._outlived.get(StorageWeakRef(t.untyped_storage()).cdata)
            return (seen is not None and not seen.expired()) or site in self._outlived_sites

    def _write(self, h: _Handle, box: list) -> None:
        t = box.pop()  # the only reference here: gone before the write counts as done
        try:
            if h.ready is not None:
                h.ready.synchronize()
            self.io.save(t.detach(), h.path)
        finally:
            del t
            with self._lock:
                self._inflight -= h.nbytes
                if h in self._pending_writes:
                    self._pending_writes.remove(h)
                self._lock.notify_all()

    def _read(self, h: _Handle) -> torch.Tensor:
        h.written.result()
        return self.io.load(h.path, device=h.device)

    def _start_read(self, h: _Handle) -> None:
        if h.read is None and h.used < h.uses and self._pool is not None:
            h.read = self._pool.submit(self._read, h)

    def _unpack(self, packed):
        if not isinstance(packed, _Handle):
            return packed
        with self._lock:
            if packed.used >= packed.uses:
                raise RuntimeError("fastckpt activation offload: this saved activation was already used by "
                                   "backward and its file removed; a second backward through the same graph "
                                   "(retain_graph=True) is not supported with offload")
            if self._pool is None:
                raise RuntimeError("fastckpt activation offload: backward ran after the step was closed")
            self._start_read(packed)
            for j in range(packed.index - 1, max(-1, packed.index - 1 - self.prefetch), -1):
                later = self._order[j]  # backward goes in reverse pack order
                if later.read is None and later.used < later.uses:
                    self._start_read(later)
                    self.stats["prefetched"] += 1
            future = packed.read
        t = future.result()
        with self._lock:
            packed.used += 1
            if packed.used == 1 and not self._pending_writes and not packed.original.expired():
                # every write is done, so nothing here holds the storage: something else does
                self._outlived[packed.original.cdata] = packed.original
                self._outlived_sites[packed.site] = None
                if len(self._outlived_sites) > OUTLIVED_SITES:
                    del self._outlived_sites[next(iter(self._outlived_sites))]
            if packed.used >= packed.uses:  # its last use: nothing here keeps the tensor or the file
                packed.read = None
                try:
                    os.unlink(packed.path)
                except FileNotFoundError:
                    pass
            done = self.close_when_used and all(h.used >= h.uses for h in self._order)
        if done:
            self.close()
        return t
