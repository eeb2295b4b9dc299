"""Conformance of every write implementation to the protocol in fastckpt/write/protocol.py.

The same tests run over host tensors x {file, memory file, mapped pool} (HostFileWrite into a
FileSink and into a MemoryFileSink on /dev/shm, HostMappedWrite)
and over the stream-read writes (DeviceFileWrite, DeviceMappedWrite) driven by HostStream,
the stream protocol over host memory: the very feeder, drain, latches and staging logic
that CUDA tensors go through, run here without a GPU. That is not GPU coverage (side
streams, pinned memory, kvikio): the "cuda-*" variants run the same tests over CUDA tensors
and their real side streams, marked `gpu` (make test-gpu).

Each implementation and strategy: the phases in order; the gate (the file holds the state as
of save() although every tensor is overwritten right after wait_copied); "copied" reached
without finish(); the staging it declares is all it draws, down to a single chunk; held
release; abort; a sink error raised; a stuck writer surfaces as WriteStalled after the deadline.
"""
from __future__ import annotations

import copy
import os
import threading
import time

import pytest
import torch

import fastckpt
from fastckpt.write.native_engine import new_engine
from fastckpt.format import plan_file
from fastckpt.pmem import layout as L
from fastckpt.pmem.pool import Pool
from fastckpt import _native
from fastckpt.write import Deadline, FileSink, MappedSink, MemoryFileSink, WriteStalled
from fastckpt.write.device_file import DeviceFileWrite
from fastckpt.write.device_mapped import DeviceMappedWrite
from fastckpt.write.host_file import HostFileWrite
from fastckpt.write.host_mapped import HostMappedWrite
from fastckpt.write.protocol import chunks_of
from fastckpt.write.staging import Staging
from fastckpt.write.streams import HostStream
from support.states import assert_same, state_matrix

CHUNK = 1 << 20
IMPLS = {"host-file": HostFileWrite, "host-memory": HostFileWrite, "stream-file": DeviceFileWrite, "cuda-file": DeviceFileWrite,
         "host-mapped": HostMappedWrite, "stream-mapped": DeviceMappedWrite, "cuda-mapped": DeviceMappedWrite}
STRATEGIES = ["c", "g", "d"]


def impls(*kinds: str) -> list:
    """The implementations whose sink is one of `kinds`; the CUDA ones marked gpu."""
    return [pytest.param(i, marks=pytest.mark.gpu) if i.startswith("cuda") else i
            for i in IMPLS if i.rsplit("-", 1)[1] in kinds]


ALL, FILE_IMPLS, SINK_IMPLS = impls("file", "memory", "mapped"), impls("file"), impls("file", "memory")


def small_state() -> dict:
    g = torch.Generator().manual_seed(7)
    return {"big": torch.randn(3 << 18, generator=g),  # 3 MiB: spans several 1 MiB chunks
            "w": torch.randn(300, 7, generator=g), "step": torch.tensor(5.0),
            "ints": torch.arange(1000), "half": torch.randn(513, generator=g).half(), "epoch": 3}


class Harness:
    """What a Checkpointer does around one write: an engine, staging grown as declared, a sink."""

    def __init__(self, tmp_path, shm, impl: str, fmt: str = "torch", stall_s: float = 10.0,
                 staging: int | None = None):
        self.impl, self.cls = impl, IMPLS[impl]
        self.device = "cuda" if impl.startswith("cuda") else "cpu"
        self.mapped, self.memory = impl.endswith("mapped"), impl.endswith("memory")
        self.fmt = "safetensors" if self.mapped else fmt
        self.engine = new_engine(CHUNK >> 20, 4)
        self.staging_cap = staging
        self.deadline = Deadline(stall_s, lambda: self.engine.progress)
        self.tmp_path, self.shm = tmp_path, shm
        self.pool = None
        self.streams: list = []

    def plan(self, state):
        return plan_file(state, self.fmt, allow_pickle=self.mapped)

    def file_sink(self, path: str):
        """This implementation's kind of file sink at path."""
        return MemoryFileSink(path) if self.memory else FileSink(path, direct_io=True)

    def sink(self, name: str = "ckpt"):
        if not self.mapped:
            return self.file_sink(os.path.join(self.shm, name) if self.memory else str(self.tmp_path / name))
        if self.pool is None:
            self.pool = Pool(os.path.join(self.shm, "pool"), 64)
        return MappedSink(self.pool, L.HEAP_OFF)

    def state(self, state: dict) -> dict:
        """`state` on this implementation's device."""
        return {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in state.items()}

    def start(self, state, strategy: str, held: bool = False, sink=None, delay_s: float = 0.0):
        plan = self.plan(state)
        need = chunks_of(plan, CHUNK) if self.cls.stages(strategy, True) else 0
        grow = need if self.staging_cap is None else min(need, self.staging_cap)
        staging = Staging(self.engine, 1, None, "wait")
        staging.ensure(grow)
        staging.wait_grown()  # it grows in the background; the protocol is tested on a grown pool
        # cuda: its own side streams; host: copies that complete delay_s after they are issued
        extra = {"stream": HostStream(delay_s=delay_s)} if self.impl.startswith("stream") else {}
        self.streams += extra.values()
        return self.cls(self.engine, plan, sink or self.sink(), strategy, self.deadline, held, **extra)

    def load(self, result, plan):
        """The state the finished write holds (a pool version is joined back into its file)."""
        if not self.mapped:
            return fastckpt.load(result.path)
        (_, header), = result.blobs
        path = self.tmp_path / "joined.safetensors"
        with open(path, "wb") as f:
            f.write(header)
            f.write(bytes(self.pool.view[L.HEAP_OFF:L.HEAP_OFF + plan.data_end - plan.data_begin]))
        return fastckpt.load(path)

    def close(self):
        for stream in self.streams:  # a write abandoned by its test leaves its stream's worker behind
            stream.close()
        if self.pool is not None:
            self.pool.close()


@pytest.fixture
def harness(tmp_path, shm):
    made = []

    def make(impl, **kw):
        h = Harness(tmp_path, shm, impl, **kw)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def overwrite_in_place(state) -> None:
    for v in state.values():
        if isinstance(v, torch.Tensor) and v.numel():
            v.view(-1).view(torch.uint8).fill_(0xA5) if v.is_contiguous() else v.zero_()


FORMATS = [pytest.param(i, fmt, marks=[pytest.mark.gpu] if i.startswith("cuda") else [], id=f"{i}-{fmt}")
           for i in IMPLS for fmt in ("torch", "safetensors")
           if fmt == "safetensors" or i.endswith("file")]  # a pool keeps safetensors images


@pytest.mark.parametrize("impl,fmt", FORMATS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_phases_in_order_roundtrip_bit_exact(harness, impl, strategy, fmt):
    h = harness(impl, fmt=fmt)
    state = state_matrix(h.device)
    w = h.start(state, strategy)
    assert w.wait_copied(10)
    result = w.finish()
    data = sum(r.nbytes for r in w.plan.records)
    assert data <= w.bytes_written <= w.plan.data_end - w.plan.data_begin  # staged: whole chunks
    assert result.bytes == w.plan.file_size and len(result.record_crcs) == len(w.plan.records)
    assert_same(state, h.load(result, w.plan))


@pytest.mark.parametrize("impl", ALL)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_gate_keeps_the_state_as_of_save(harness, impl, strategy):
    h = harness(impl)
    state = h.state(small_state())
    expect = copy.deepcopy(state)
    w = h.start(state, strategy)
    assert w.wait_copied(10)
    overwrite_in_place(state)  # the optimizer step, right after the gate
    assert_same(expect, h.load(w.finish(), w.plan))


@pytest.mark.parametrize("impl", ALL)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_copied_is_reached_without_finish(harness, impl, strategy):
    """Regression (d hung on CUDA): the commit thread waited for "copied", which only
    finish() — called by that same thread afterwards — set."""
    h = harness(impl)
    w = h.start(h.state(small_state()), strategy)
    assert w.wait_copied(10), "copied never reached without finish()"
    assert w.copied()
    w.finish()
    t = w.timings()  # where its time went (fastckpt.timings): both latches, in order, after the start
    assert 0 < t["copied_at"] <= t["written_at"] <= time.monotonic(), t
    assert all(v >= 0 for v in t.values()) and t.get("put", 0) + t.get("persist", 0) + t.get("crc", 0) > 0, t


@pytest.mark.parametrize("impl", ALL)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("cap", [None, 1])
def test_the_staging_a_write_declares_is_all_it_draws(harness, impl, strategy, cap):
    """Regression (g hung on CUDA): the owner grew staging for strategy c only, while g drew
    staging chunks too; its feeder waited for one for ever. Here the pool holds exactly what
    the implementation declares (or one chunk), and the write must finish within its deadline."""
    h = harness(impl, staging=cap, stall_s=5.0)
    state = h.state(small_state())
    w = h.start(state, strategy)
    assert h.engine.pool.capacity == (0 if not w.stages(strategy, True) else
                                      min(chunks_of(w.plan, CHUNK), cap or 1 << 30))
    assert w.wait_copied(10)
    assert_same(state, h.load(w.finish(), w.plan))
    assert h.engine.pool.free_count == h.engine.pool.capacity  # every chunk came back


@pytest.mark.parametrize("impl", ALL)
@pytest.mark.parametrize("strategy", ["c", "d"])
def test_held_write_reads_only_what_is_released(harness, impl, strategy):
    """Releasing one record that spans several chunks, with copies still in flight (a stream's
    copies complete later), then waiting for it: regression of the layer-wise hang on CUDA,
    where the feeder handed over one chunk in flight and then blocked for a release that the
    waiting (inline, NCCL) bucket callback could never make."""
    h = harness(impl)
    state = h.state(small_state())
    expect = copy.deepcopy(state)
    w = h.start(state, strategy, held=True, delay_s=0.02)
    time.sleep(0.2)
    assert w.bytes_written == 0 and not w.copied()
    big = [i for i, r in enumerate(w.plan.records) if r.nbytes >= 3 * CHUNK]
    assert big, "the state needs a record spanning several chunks"
    w.release(big)
    assert w.wait_records(big, 10), "the released record was never copied"
    finished = {}
    t = threading.Thread(target=lambda: finished.setdefault("r", w.finish()))
    t.start()  # the commit thread: it waits (no deadline) while the rest is held
    t.join(0.5)
    # staged d through a stream (no kvikio) holds the gate until the whole file is written,
    # so waiting for one record released them all
    still_held = not (isinstance(w, DeviceFileWrite) and strategy == "d" and not w.mode.startswith("kvikio"))
    assert t.is_alive() == still_held, "finish() did not wait for the held records"
    assert w.wait_copied(10)  # the gate releases everything
    overwrite_in_place(state)
    t.join(20)
    assert not t.is_alive()
    assert_same(expect, h.load(finished["r"], w.plan))


@pytest.mark.parametrize("impl", ALL)
def test_abort_fails_every_later_wait_with_its_error(harness, impl):
    h = harness(impl)
    w = h.start(h.state(small_state()), "c", held=True)
    err = fastckpt.CheckpointWriteError("stopped by the test")
    assert w.abort(err)
    assert w.abort(err)  # idempotent
    with pytest.raises(fastckpt.CheckpointWriteError, match="stopped by the test"):
        w.wait_copied(5)
    with pytest.raises(fastckpt.CheckpointWriteError, match="stopped by the test"):
        w.finish()
    assert h.engine.pool.free_count == h.engine.pool.capacity


@pytest.mark.parametrize("impl", SINK_IMPLS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_sink_error_is_raised(harness, tmp_path, impl, strategy):
    h = harness(impl)
    w = h.start(h.state(small_state()), strategy, sink=h.file_sink(str(tmp_path / "missing" / "ckpt")))
    with pytest.raises(OSError, match="missing"):
        w.wait_copied(10)
        w.finish()


@pytest.fixture
def fifo(tmp_path):
    """A FIFO nobody reads: opening it for writing blocks in the kernel (a writer that never
    finishes). Opened for reading at the end, so that the stuck writer thread goes."""
    path = str(tmp_path / "stuck")
    os.mkfifo(path)
    yield path
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    time.sleep(0.2)
    os.close(fd)


@pytest.mark.parametrize("impl", FILE_IMPLS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_stuck_writer_is_write_stalled_not_a_hang(harness, fifo, impl, strategy):
    h = harness(impl, stall_s=1.0, staging=1)
    w = h.start(h.state(small_state()), strategy, sink=FileSink(fifo, direct_io=False, gds=False))
    t0 = time.monotonic()
    with pytest.raises(WriteStalled, match="nothing moved for 1 s") as got:
        w.wait_copied()  # c/d: the copies wait for the writers (one staging chunk); g: finish does
        w.finish()
    assert time.monotonic() - t0 < 10
    assert "stuck" in str(got.value)  # names the file it waited for
    assert w.abort(got.value) in (True, False)  # bounded either way
