"""Side streams: what the device writes need from the memory their tensors live in.

A stream takes copies in order and completes them asynchronously; a mark completes once
every copy issued before it has. `CudaStreams` is one side stream per CUDA device a
snapshot reads, each ordered after that device's current stream when it is made (so its
copies see the tensors as of save()); every CUDA tensor it copies is recorded on it, so
the caching allocator never hands its memory to another tensor while a copy may still read
it. `HostStream` is the same protocol over host memory, one worker thread in order: with
it the device writes run — and their conformance tests run — on a machine without CUDA.
A failed copy makes every later mark raise instead of completing.

Waiting on a mark never polls under the GIL: a CUDA mark is awaited by one waiter thread
per CudaStreams, blocked in `cudaEventSynchronize` (blocking-sync events, the GIL released,
no core spinning) and then setting a threading.Event; `Mark.wait(seconds)` blocks on that
Event, which also releases the GIL. A background write thus takes the GIL once per chunk
it hands over, not hundreds of times a second — each take can hold the training thread up
to Python's switch interval (5 ms).

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
    """Completes once the copies issued before it have; query() and wait() raise a copy's error."""

    def __init__(self, done: threading.Event, error: Callable[[], BaseException | None]):
        self._done, self._error = done, error

    def query(self) -> bool:
        return self.wait(0.0)

    def wait(self, seconds: float) -> bool:
        """Blocks (without the GIL) at most `seconds`; True once complete."""
        if not self._done.wait(seconds):
            return False
        err = self._error()
        if err is not None:
            raise err
        return True


class _CudaMarkWaiter:
    """One thread that synchronizes on marks' events in the order they were made (they complete
    in stream order) and sets each mark's Event; the first error is every later mark's."""

    def __init__(self):
        self._q: "queue.Queue" = queue.Queue()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="fastckpt-cuda-marks", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            events, done = item
            if self.error is None:
                try:
                    for ev in events:
                        ev.synchronize()  # releases the GIL; blocking-sync events sleep
                except BaseException as e:  # noqa: BLE001 - raised by this mark and every later one
                    self.error = e
            done.set()

    def add(self, events) -> Mark:
        done = threading.Event()
        self._q.put((events, done))
        return Mark(done, lambda: self.error)

    def close(self) -> None:
        self._q.put(None)  # marks already queued still complete


class CudaStreams:
    """One side stream per CUDA device of a plan."""

    def __init__(self, devices):
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        for dev in devices:
            s = torch.cuda.Stream(dev)
            s.wait_stream(torch.cuda.current_stream(dev))  # the values as of save()
            self._streams[dev] = s
        self._waiter: _CudaMarkWaiter | None = None

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
            ev = torch.cuda.Event(blocking=True)
            ev.record(s)
            events.append(ev)
        if self._waiter is None:
            self._waiter = _CudaMarkWaiter()
        return self._waiter.add(events)

    def spare(self, device: torch.device, nbytes: int) -> torch.Tensor | None:
        """nbytes of spare memory on `device` (allocated for this stream), or None when short."""
        free, _ = torch.cuda.mem_get_info(device)
        if nbytes * 1.1 > free:
            return None
        with torch.cuda.stream(self._stream_of(device)):
            return torch.empty(nbytes, dtype=torch.uint8, device=device)

    def close(self) -> None:
        self._streams = {}
        if self._waiter is not None:
            self._waiter.close()
            self._waiter = None


class HostStream:
    """The stream protocol over host memory: one worker thread runs the copies in order.
    delay_s: each copy takes at least this long on the worker (a device's copies completing
    one after another, later than they were issued), for tests that need copies in flight.
    hold: a copy waits until this event is set (a stream slowed down for as long as a test
    needs: what may wait for a copy, and what must not, is then told apart without timing)."""

    def __init__(self, plan: FilePlan | None = None, delay_s: float = 0.0, hold: threading.Event | None = None):
        self.delay_s, self.hold = delay_s, hold
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
            if self.hold is not None:
                self.hold.wait()
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
        done = threading.Event()
        if self._closed:  # everything issued runs before the worker ends
            threading.Thread(target=lambda: (self._thread.join(), done.set()), name="fastckpt-mark",
                             daemon=True).start()
        else:
            self._q.put(done)
        return Mark(done, lambda: self._error)

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
