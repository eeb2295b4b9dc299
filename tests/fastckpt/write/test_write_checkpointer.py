"""The Checkpointer over the write path: stream-read writes end to end, and no wait that hangs.

- With HostStream registered for host tensors (streams.STREAMS["cpu"]), the Checkpointer
  routes them through DeviceFileWrite / DeviceMappedWrite — the orchestration CUDA tensors
  get — for every strategy and both stores: save, gate, overwrite, commit, load. These are
  the two hang regressions at the Checkpointer's level (g drew staging the Checkpointer never
  grew; d's commit thread waited for a latch only it would set): each is bounded by a short
  stall_timeout_s, so a regression fails here in seconds instead of hanging.
- A writer stuck in the kernel (a FIFO nobody reads) surfaces as WriteStalled from gate()
  (on_error="raise") or as a warning with training going on (on_error="warn").
- A slow writer that keeps moving (each pwrite and fdatasync delayed by the LD_PRELOAD shim)
  never trips the deadline, although the whole write takes several times as long.
"""
from __future__ import annotations

import copy
import os
import subprocess
import sys
import threading
import time
import warnings

import pytest
import torch

import fastckpt
from fastckpt.store import ahead
from fastckpt.write import WriteStalled
from fastckpt.write.streams import STREAMS, HostStream
from support.states import assert_same, state_matrix

from support.paths import ROOT, python_path


@pytest.fixture
def host_as_stream(monkeypatch):
    monkeypatch.setitem(STREAMS, "cpu", HostStream)


def _state():
    g = torch.Generator().manual_seed(3)
    return {"model": {f"w{i}": torch.randn(1 << 18, generator=g) for i in range(4)},
            "opt": {"state": {0: {"step": torch.tensor(9.0), "exp_avg": torch.randn(4096, generator=g)}}}}


@pytest.mark.parametrize("store", ["root", "pmem"])
@pytest.mark.parametrize("strategy", ["c", "g", "d"])
def test_stream_writes_commit_through_the_checkpointer(tmp_path, shm, host_as_stream, store, strategy):
    where = dict(root=os.path.join(shm, "pool"), store="pmem", pool_mb=64) if store == "pmem" else dict(root=tmp_path)
    with fastckpt.Checkpointer(strategy=strategy, chunk_mb=1, stall_timeout_s=5, **where) as ck:
        for step in (1, 2, 3):
            state = _state()
            expect = copy.deepcopy(state)
            p = ck.save(state, step=step)
            assert type(p.write).__name__ in ("DeviceFileWrite", "DeviceMappedWrite")
            ck.gate()
            for t in (state["model"]["w0"], state["opt"]["state"][0]["step"]):
                t.mul_(-3)  # the update after the gate
            assert p.wait().step == step
            assert_same(expect, ck.load())


def test_stream_writes_keep_full_state_matrix(tmp_path, host_as_stream):
    state = state_matrix()
    with fastckpt.Checkpointer(tmp_path, strategy="g", chunk_mb=1, format="safetensors", stall_timeout_s=5) as ck:
        ck.save(state, step=1).wait()
        assert_same(state, ck.load())


def test_a_save_that_finds_staging_short_goes_through_spare_memory(tmp_path, host_as_stream):
    """The first save of a run (nothing reserved) neither grows staging on the training
    thread nor makes the gate wait for it: a stream-read 'c' write copies into spare device
    memory first ('g') while staging grows in the background; once staging is there, 'c'
    copies straight into it again."""
    grown_on = []
    with fastckpt.Checkpointer(tmp_path, strategy="c", chunk_mb=1, stall_timeout_s=10) as ck:
        ck._engine_now()  # the engine and its staging exist before the first save: watch them grow
        staging = ck._staging
        grow = staging.grow
        staging.grow = lambda n: (grown_on.append(threading.current_thread().name), grow(n))[1]
        state = _state()
        expect = copy.deepcopy(state)
        p = ck.save(state, step=1)
        assert p.write.mode == p.mode == "device-copy" and ck.stats["spare_first"] == 1
        assert p.strategy == "g" and ck.stats["modes"] == {"device-copy": 1}  # the change is recorded
        ck.gate()
        state["model"]["w0"].mul_(-3)
        assert p.wait().step == 1
        assert_same(expect, ck.load())
        staging.wait_grown()
        p = ck.save(state, step=2)
        assert p.write.mode == "pinned-staging" and ck.stats["spare_first"] == 1
        assert p.strategy == "c" and ck.stats["modes"] == {"device-copy": 1, "pinned-staging": 1}
        p.wait()
    assert grown_on and set(grown_on) == {"fastckpt-reserve"}, grown_on


def test_a_held_save_never_goes_through_spare_memory(tmp_path, host_as_stream):
    """A held (layer-wise) write reads a tensor only once it is released, also on the first save
    while staging still grows: going through spare memory would copy every tensor at save()
    (found on an H200: a held 'c' write was copied before anything was released)."""
    with fastckpt.Checkpointer(tmp_path, strategy="c", chunk_mb=1, stall_timeout_s=10) as ck:
        state = _state()
        p = ck.save(state, step=1, held=True)
        assert p.write.mode == "pinned-staging" and ck.stats["spare_first"] == 0
        time.sleep(0.2)
        assert not p.copied()
        state["model"]["w0"].mul_(-3)  # changed before its release: the checkpoint holds this value
        expect = copy.deepcopy(state)
        p.release_all()
        ck.gate()
        assert p.wait().step == 1
        assert_same(expect, ck.load())


def test_policy_skip_grows_staging_at_once(tmp_path):
    state = {"w": torch.randn(3 << 18)}  # 3 MiB: three 1 MiB chunks
    with fastckpt.Checkpointer(tmp_path, chunk_mb=1, policy="skip") as ck:
        p = ck.save(state, step=1)
        assert ck._engine.pool.capacity == 3 and not p.skipped
        p.wait()


def _stuck_next_checkpoint(ck, root: str, step: int, counter: int) -> str:
    """The file the next checkpoint will be written to, made a link to a FIFO nobody reads
    (opening it for writing blocks in the kernel). The FIFO lives outside the checkpoint
    directory, which the failed checkpoint's cleanup removes, so the test can unblock it. The
    file made ahead for it is removed first (the commit threads joined: none is being made), else
    the save would move it over the link."""
    ck._commits.join()
    ahead.clear(root)
    d = os.path.join(root, f"step-{step:08d}.c{counter:06d}")
    os.makedirs(d)
    fifo = os.path.join(os.path.dirname(root), f"fifo-{step}")
    os.mkfifo(fifo)
    os.symlink(fifo, os.path.join(d, "rank-0.pt"))
    return fifo


def _unstick(fifo: str) -> None:
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    time.sleep(0.3)
    os.close(fd)


@pytest.mark.parametrize("strategy", ["c", "d"])
def test_a_stuck_writer_raises_from_the_gate_instead_of_hanging(tmp_path, strategy):
    state = {"w": torch.randn(4 << 18)}  # 4 MiB: more than the one staging chunk allowed
    tmp_path = tmp_path / "ckpts"
    ck = fastckpt.Checkpointer(tmp_path, strategy=strategy, chunk_mb=1, staging_mb=1, direct_io=False,
                               stall_timeout_s=1.0)
    ck.save(state, step=1).wait()
    fifo = _stuck_next_checkpoint(ck, str(tmp_path), 2, 2)
    try:
        ck.save(state, step=2)
        t0 = time.monotonic()
        with pytest.raises(WriteStalled, match="nothing moved for 1 s") as got:
            ck.gate()
        assert time.monotonic() - t0 < 10
        assert "step-00000002" in str(got.value)
    finally:
        _unstick(fifo)
    ck.wait()  # the stalled checkpoint was reported once, at the gate
    assert ck.latest().step == 1
    state["w"].add_(1)
    ck.save(state, step=3).wait()
    assert_same(state, ck.load())
    ck.close()


def test_a_stuck_writer_with_on_error_warn_lets_training_go_on(tmp_path):
    state = {"w": torch.randn(4 << 18)}
    tmp_path = tmp_path / "ckpts"
    ck = fastckpt.Checkpointer(tmp_path, chunk_mb=1, staging_mb=1, direct_io=False, stall_timeout_s=1.0,
                               on_error="warn")
    ck.save(state, step=1).wait()
    fifo = _stuck_next_checkpoint(ck, str(tmp_path), 2, 2)
    try:
        ck.save(state, step=2)
        with pytest.warns(UserWarning, match="nothing moved"):
            ck.gate()
    finally:
        _unstick(fifo)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ck.wait()
    ck.save(state, step=3).wait()
    assert ck.latest().step == 3 and ck.stats["failed"] >= 1
    ck.close()


def test_save_returns_before_a_held_stream_copies_and_the_gate_waits_for_the_copy_alone(tmp_path, monkeypatch):
    """save() only enqueues a stream-read snapshot's copies: with the host stand-in for a CUDA
    stream held (no copy runs until the test lets it), save() still returns, and the checkpoint
    is not copied. The gate then waits for the copies, and only for them: once they run it
    returns while the checkpoint's file cannot even be opened yet (its writer is stuck on a
    FIFO nobody reads), so nothing of it is written. No timing decides any of it. (Strategy c:
    g copies host storages in save() itself, so on the host stand-in it has no copy to hold.)"""
    strategy = "c"
    hold = threading.Event()
    monkeypatch.setitem(STREAMS, "cpu", lambda plan: HostStream(plan, hold=hold))
    root = tmp_path / "ckpts"
    state = _state()
    threads = []

    def run(job) -> threading.Event:
        ended = threading.Event()
        th = threading.Thread(target=lambda: (job(), ended.set()), daemon=True)
        th.start()
        threads.append(th)
        return ended

    with fastckpt.Checkpointer(root, strategy=strategy, chunk_mb=1, direct_io=False, stall_timeout_s=60) as ck:
        hold.set()
        ck.save(state, step=1).wait()  # staging grows meanwhile; the next save draws it
        ck._staging.wait_grown()
        hold.clear()
        fifo = _stuck_next_checkpoint(ck, str(root), 2, 2)
        got = {}
        try:
            saved = run(lambda: got.setdefault("p", ck.save(state, step=2)))
            assert saved.wait(30), "save() waited for the stream's copies"
            p = got["p"]
            assert p.strategy == strategy and not p.copied()
            assert p.timings["save"] > 0 and "copied_at" not in p.timings
            gated = run(ck.gate)
            assert not gated.wait(0.5), "the gate returned before the copies ran"
            hold.set()
            assert gated.wait(30), "the gate waited for more than the copy"
            assert p.copied() and not p.done() and p.write.bytes_written == 0  # the file is not even open
        finally:
            hold.set()
            _unstick(fifo)
        with pytest.raises(fastckpt.CheckpointWriteError):
            p.wait()  # a FIFO takes no pwrite: this checkpoint fails, the one before stays
        assert p.timings["gate"] > 0 and p.timings["stream_wait"] > 0
        assert ck.latest().step == 1
        state["model"]["w0"].mul_(-3)
        ck.save(state, step=3).wait()
        assert_same(state, ck.load())
    for th in threads:
        th.join(10)


def test_a_save_that_waits_for_the_disk_says_so_once(tmp_path, monkeypatch, caplog):
    """Checkpoints issued faster than they are written: with one slot and the first checkpoint's
    copies held, the second save() waits for its slot (about the 0.3 s the test holds it);
    that wait is in its Pending.timings, counted in stats["slot_waits"], and said in one logged
    line, once per Checkpointer, instead of a silent stall."""
    hold = threading.Event()
    monkeypatch.setitem(STREAMS, "cpu", lambda plan: HostStream(plan, hold=hold))
    state = _state()
    with fastckpt.Checkpointer(tmp_path, chunk_mb=1, concurrency=1, stall_timeout_s=60) as ck:
        ck.save(state, step=1)
        threading.Timer(0.3, hold.set).start()
        with caplog.at_level("WARNING", logger="fastckpt"):
            p = ck.save(state, step=2)
            ck.wait()
            hold.clear()
            ck.save(state, step=3)
            threading.Timer(0.3, hold.set).start()
            ck.save(state, step=4).wait()
        # the wait begins a moment after the 0.3 s hold's timer started (a clean-clone run saw 0.2989 s)
        assert p.timings["slot"] >= 0.2 and ck.stats["slot_waits"] == 2
    said = [r.getMessage() for r in caplog.records if "faster than the disk" in r.getMessage()]
    assert len(said) == 1 and "step 2 waited" in said[0], said


SLOW_CHILD = """
import sys, time, torch, fastckpt
root = sys.argv[1]
state = {"w": torch.randn(6 << 20)}  # 24 MiB: 24 chunks, one writer
with fastckpt.Checkpointer(root, chunk_mb=1, writers=1, concurrency=1, direct_io=False,
                           stall_timeout_s=0.5) as ck:
    t0 = time.monotonic()
    ck.save(state, step=1)
    ck.gate()
    ck.wait()
    took = time.monotonic() - t0
    assert torch.equal(ck.load()["w"], state["w"])
print("ok", round(took, 2))
"""


def test_a_slow_writer_that_keeps_moving_never_trips_the_deadline(tmp_path, fault_shim):
    root = tmp_path / "slow-ckpts"
    env = dict(os.environ, LD_PRELOAD=fault_shim, FASTCKPT_FAULT_PATH=str(root), FASTCKPT_FAULT_SLOW_US="100000",
               PYTHONPATH=python_path(ROOT))
    out = subprocess.run([sys.executable, "-c", SLOW_CHILD, str(root)], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    took = float(out.stdout.split()[-1])
    assert took > 4 * 0.5, f"the shim did not slow the writes ({took} s): the test proves nothing"
