"""Side streams: what the device writes need from the memory their tensors live in.

A stream takes copies in order and completes them asynchronously; a mark completes once
every copy issued before it has. `CudaStreams` is one side stream per CUDA device a
snapshot reads, each ordered after that device's current stream when it is made (so its
copies see the tensors as of save()); every CUDA tensor it copies is recorded on it, so
the caching allocator never hands its memory to another tensor while a copy may still read
it. `HostStream` is the same protocol over host memory, one worker thread in order: with
it the device writes run — and their conformance tests run — on a machine without CUDA.
A failed copy makes every later mark raise instead of completing.

`STREAMS` maps a device type to the stream for a plan on it; select.py routes a plan to the
device writes when its device type has an entry (CUDA does).
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Callable

import torch

from ..format.plan import FilePlan


class Mark:
    """Completes once the copies issued before it have; query() raises a copy's error."""

    def __init__(self, ready: Callable[[], bool]):
        self._ready = ready

    def query(self) -> bool:
        return self._ready()


class CudaStreams:
    """One side stream per CUDA device of a plan."""

    def __init__(self, devices):
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        for dev in devices:
            s = torch.cuda.Stream(dev)
            s.wait_stream(torch.cuda.current_stream(dev))  # the values as of save()
            self._streams[dev] = s

    @classmethod
    def for_plan(cls, plan: FilePlan) -> "CudaStreams":
        return cls({r.storage.device for r in plan.records if r.storage.device.type == "cuda"})

    def _stream_of(self, dev: torch.device) -> torch.cuda.Stream:
        if dev not in self._streams:  # a spare buffer or source on a device not seen at save()
            s = torch.cuda.Stream(dev)
            s.wait_stream(torch.cuda.current_stream(dev))
            self._streams[dev] = s
        return self._streams[dev]

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dev = src.device if src.is_cuda else dst.device
        if dev.type != "cuda":
            dst.copy_(src)  # host to host: now, on this thread
            return
        s = self._stream_of(dev)
        with torch.cuda.stream(s):
            dst.copy_(src, non_blocking=True)
        for t in (src, dst):
            if t.is_cuda:
                t.record_stream(s)

    def mark(self) -> Mark:
        events = []
        for s in self._streams.values():
            ev = torch.cuda.Event()
            ev.record(s)
            events.append(ev)
        return Mark(lambda: all(ev.query() for ev in events))

    def spare(self, device: torch.device, nbytes: int) -> torch.Tensor | None:
        """nbytes of spare memory on `device` (allocated for this stream), or None when short."""
        free, _ = torch.cuda.mem_get_info(device)
        if nbytes * 1.1 > free:
            return None
        with torch.cuda.stream(self._stream_of(device)):
            return torch.empty(nbytes, dtype=torch.uint8, device=device)

    def close(self) -> None:
        self._streams = {}


class HostStream:
    """The stream protocol over host memory: one worker thread runs the copies in order.
    delay_s: each copy takes at least this long on the worker (a device's copies completing
    one after another, later than they were issued), for tests that need copies in flight."""

    def __init__(self, plan: FilePlan | None = None, delay_s: float = 0.0):
        self.delay_s = delay_s
        self._q: "queue.Queue" = queue.Queue()
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="fastckpt-host-stream", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            dst, src = item
            if self.delay_s:
                time.sleep(self.delay_s)
            if self._error is None:
                try:
                    dst.copy_(src)
                except BaseException as e:  # noqa: BLE001 - raised by every later mark
                    self._error = e

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self._q.put((dst, src))

    def mark(self) -> Mark:
        if self._closed:  # everything issued runs before the worker ends
            return Mark(lambda: not self._thread.is_alive())
        done = threading.Event()
        self._q.put(done)

        def ready() -> bool:
            if not done.is_set():
                return False
            if self._error is not None:
                raise self._error
            return True

        return Mark(ready)

    def spare(self, device: torch.device, nbytes: int) -> torch.Tensor | None:
        return torch.empty(nbytes, dtype=torch.uint8)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._q.put(None)


STREAMS: dict[str, Callable[[FilePlan], object]] = {"cuda": CudaStreams.for_plan}


def device_type(plan: FilePlan) -> str:
    """'cuda' when any storage of the plan is on a GPU, else 'cpu'; other devices are refused."""
    types = plan.devices()
    if "cuda" in types:
        return "cuda"
    other = types - {"cpu"}
    if other:
        raise ValueError(f"cannot checkpoint tensors on device type(s) {sorted(other)}; "
                         "move them to CPU or CUDA first")
    return "cpu"
