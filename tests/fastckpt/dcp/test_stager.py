"""FastStager under real dcp.async_save and FastStorageWriter: async_save returns before the
optimizer's tensors are copied and the optimizer step waits for that copy (the checkpoint holds
the state of the save, not of the step after it); a tensor written in place by anything else
before its copy fails that save (TornSnapshotError) and nothing of it is committed; buffers are
reused from save to save and never more than `concurrency` snapshots are staged or written; the
writer writes staged snapshots without a second copy, and copies the optimizer's tensors itself
when its stager hands them on live ('c' on the host); policy='skip' raises SaveSkipped, agreed on
2 gloo ranks; a background copy failing on one rank fails that save on both, before DCP's
collectives. A copy is held deterministically by making the stager's thread wait on an event
before it copies (the stager calls fastckpt.dcp.staged.copy_leaf for every copy), and the writer's
save before it begins."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from fastckpt.dcp import FastStager, FastStorageReader, FastStorageWriter, SaveSkipped, staged
from fastckpt.errors import ConfigError
from fastckpt.errors import TornSnapshotError
from support import warm
from support.paths import ROOT, WORKERS, python_path
from support.processes import free_port

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class Held:
    """The copies of the optimizer's tensors wait until release(), wherever they run: the stager
    thread's copies (a stager not given its writer), and the save of the writer a stager hands
    those tensors to live ('c' on the host), before it begins; copies made on the caller's
    thread do not."""

    def __init__(self, monkeypatch):
        self.go, self.waiting = threading.Event(), threading.Event()
        real_copy, real_begin = staged.copy_leaf, FastStorageWriter._begin_file

        def wait_here() -> None:
            self.waiting.set()
            assert self.go.wait(60)

        def copy(src, buf, stream=None):
            if threading.current_thread().name.startswith("fastckpt-dcp-stage"):
                wait_here()
            real_copy(src, buf, stream)

        def begin(writer, plan, planner, name, path):
            if threading.current_thread() is not threading.main_thread():  # an async_save's thread
                wait_here()
            return real_begin(writer, plan, planner, name, path)

        monkeypatch.setattr(staged, "copy_leaf", copy)
        monkeypatch.setattr(FastStorageWriter, "_begin_file", begin)

    def release(self) -> None:
        self.go.set()


class Run:
    """A small model trained with Adam, saved with async_save through our stager and writer."""

    def __init__(self, root, linked: bool = True, **stager):
        torch.manual_seed(0)
        self.root = root
        self.model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 4))
        self.optim = torch.optim.Adam(self.model.parameters(), lr=1e-2)
        self.writer = FastStorageWriter(root, chunk_mb=1)
        self.stager = FastStager(**stager, writer=self.writer if linked else None)
        self.n = 0

    def backward(self) -> None:
        self.n += 1
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(self.n))
        self.model(x).square().mean().backward()

    def step(self) -> None:
        self.backward()
        self.optim.step()
        self.optim.zero_grad()

    def state(self) -> dict:
        return {"model": self.model.state_dict(), "optim": self.optim.state_dict()}

    def save(self, name: str):
        return dcp.async_save(self.state(), checkpoint_id=os.path.join(self.root, name),
                              storage_writer=self.writer, async_stager=self.stager)

    def trained_and_trusted(self) -> None:
        """Steps and saves until the stager copies the optimizer's tensors after async_save returns."""
        for i in range(3):
            self.step()
            self.save(f"warm-{i}").upload_completion.result()
        assert self.stager.stats["copied_later"] > 0

    def close(self) -> None:
        self.stager.close()
        self.writer.close()


def model_state(run: Run) -> dict:
    return {k: v.clone() for k, v in run.model.state_dict().items()}


def loaded(path, like: dict) -> dict:
    out = {"model": {k: torch.zeros_like(v) for k, v in like.items()}}
    dcp.load(out, storage_reader=FastStorageReader(path))
    return out["model"]


def equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("linked", [True, False], ids=["the-writer-copies", "the-stager-copies"])
def test_async_save_returns_before_the_copy_and_the_optimizer_step_waits_for_it(tmp_path, monkeypatch, linked):
    run = Run(tmp_path, linked=linked)
    try:
        run.trained_and_trusted()
        held = Held(monkeypatch)
        before = model_state(run)
        saving = run.save("held")
        assert held.waiting.wait(30)  # async_save returned; the writer (or the stager's thread) waits to copy
        if not linked:
            assert not saving.staging_completion.done()
        run.backward()
        stepped = threading.Event()
        stepper = threading.Thread(target=lambda: (run.optim.step(), stepped.set()))
        stepper.start()
        assert not stepped.wait(0.5)  # the gate holds the update while the copy waits
        held.release()
        stepper.join(30)
        assert stepped.is_set()
        saving.upload_completion.result()
        assert not equal(model_state(run), before)  # the step ran after the copy ...
        assert equal(loaded(tmp_path / "held", before), before)  # ... and the checkpoint is the save's
    finally:
        run.close()


@pytest.mark.parametrize("linked", [True, False], ids=["the-writer-copies", "the-stager-copies"])
def test_a_tensor_written_in_place_before_its_copy_fails_that_save_and_commits_nothing(tmp_path, monkeypatch, linked):
    run = Run(tmp_path, linked=linked)
    try:
        run.trained_and_trusted()
        good = model_state(run)
        run.save("good").upload_completion.result()
        held = Held(monkeypatch)
        saving = run.save("torn")
        assert held.waiting.wait(30)
        with torch.no_grad():
            run.model[0].weight.add_(1.0)  # not the optimizer: the gate does not order this
        held.release()
        # found by the stager's thread: raised before DCP's collectives; by the writer that copies
        # the live tensors: in DCP's write step, which wraps it
        with pytest.raises(CheckpointException if linked else TornSnapshotError,
                           match=r"\['model'\]\['0.weight'\] was written in place"):
            saving.upload_completion.result()
        with pytest.raises(CheckpointException):  # never committed, never half-loaded
            loaded(tmp_path / "torn", good)
        assert equal(loaded(tmp_path / "good", good), good)
        run.step()
        run.save("after").upload_completion.result()  # the stager goes on
    finally:
        run.close()


@pytest.mark.parametrize("strategy", ["c", "g", "d"])
def test_buffers_are_reused_at_most_concurrency_snapshots_exist_and_each_checkpoint_is_its_step(
        tmp_path, strategy):
    run = Run(tmp_path, strategy=strategy, concurrency=2)
    try:
        want, saves = {}, []
        for i in range(6):  # nothing waits for a save: the stager bounds what is in flight
            run.step()
            want[i] = model_state(run)
            saves.append(run.save(f"s{i}"))
            assert len(run.stager._slots.every()) <= 2
        for s in saves:
            s.upload_completion.result()
        assert all(s.alive == 0 for s in run.stager._slots.every())  # each save let go of its snapshot when done
        for i in range(6):
            assert equal(loaded(tmp_path / f"s{i}", want[i]), want[i]), i
        leaves = [x for x in torch.utils._pytree.tree_leaves(run.state()) if isinstance(x, torch.Tensor)]
        assert sum(s.buffers.made for s in run.stager._slots.every()) <= 2 * len(leaves)  # 6 saves, at most 2 sets
        if strategy == "c":  # the optimizer's tensors copied once, by the writer's own save, from the live ones,
            # and each such save's copy credited to its own snapshot (two in flight hold the same live tensors)
            assert run.writer.named.opened and run.stager.stats["handed_on"] > 0
            assert run.stager.stats["copied_by_writer"] == run.stager.stats["handed_on"]
        if strategy == "g":  # staged snapshots written as they lie: no second copy
            assert set(run.writer.named.checkpointer.stats["modes"]) == {"direct"}
    finally:
        run.close()


def test_asked_from_a_saves_thread_snapshot_of_names_that_saves_own_snapshot(tmp_path):
    """Snapshots handed on live ('c' given its writer) hold the same tensors, and a finished one
    keeps its slot until the next stage() takes it again: asked from a save's thread (DCP writes on
    the thread that took the snapshot), snapshot_of names that save's own, never the earlier one
    (the writer would credit its copy to it, and the gate hold this save's step until written)."""
    run = Run(tmp_path, concurrency=2)
    try:
        run.trained_and_trusted()
        run.step()
        weight, found = run.model[0].weight, {}

        def take(name: str, future) -> None:
            snapshot = future.result()  # this thread takes the snapshot over, as DCP's save thread does
            found[name] = run.stager.snapshot_of(weight)
            del snapshot

        first = run.stager.stage(run.state())
        second = run.stager.stage(run.state())
        for name, future in (("first", first), ("second", second)):  # in order: the second waits for the first
            t = threading.Thread(target=take, args=(name, future))
            t.start()
            t.join(30)
        assert found["first"] is not None and found["second"] is not None
        assert found["first"].writer_copies and found["second"].writer_copies
        assert found["second"] is not found["first"] and found["second"].seq == found["first"].seq + 1
    finally:
        run.close()


def test_a_staged_buffer_is_page_aligned_and_a_storage_of_its_own(tmp_path):
    run = Run(tmp_path)
    try:
        run.step()
        snapshot = run.stager.stage(run.state()).result()
        w = snapshot["model"]["0.weight"]
        assert w.data_ptr() % 4096 == 0 and w.untyped_storage().nbytes() == w.nbytes
        assert run.stager.snapshot_of(w) is not None and run.stager.snapshot_of(run.model[0].weight) is None
        assert torch.equal(w, run.model[0].weight)
        del snapshot, w
    finally:
        run.close()


def test_a_plain_dcp_save_of_a_staged_snapshot(tmp_path):
    run = Run(tmp_path, concurrency=1)
    try:
        for i in range(3):  # one slot: each snapshot is let go when its save returns
            run.step()
            dcp.save(run.stager.stage(run.state()).result(), checkpoint_id=tmp_path / f"p{i}",
                     storage_writer=run.writer)
            assert equal(loaded(tmp_path / f"p{i}", model_state(run)), model_state(run))
    finally:
        run.close()


def test_policy_skip_raises_save_skipped_while_every_slot_is_taken(tmp_path, monkeypatch):
    run = Run(tmp_path, concurrency=1, policy="skip")
    try:
        run.trained_and_trusted()
        held = Held(monkeypatch)
        first = run.save("first")
        assert held.waiting.wait(30)
        with pytest.raises(SaveSkipped, match="skipped"):
            run.save("second")
        held.release()
        first.upload_completion.result()
        run.step()
        run.save("third").upload_completion.result()
        assert run.stager.stats["skipped"] == 1
        assert sorted(os.listdir(tmp_path)) == ["first", "third", "warm-0", "warm-1", "warm-2"]
    finally:
        run.close()


def test_bad_settings_are_one_line_errors():
    with pytest.raises(ValueError, match="unknown strategy"):
        FastStager(strategy="x")
    with pytest.raises(ValueError, match="concurrency must be"):
        FastStager(concurrency=0)
    with pytest.raises(ConfigError, match="pass writer="):  # nothing could refuse a 'd' snapshot written in place
        FastStager(strategy="d")


def test_a_stager_not_given_the_writer_is_written_as_a_plain_state_dict(tmp_path):
    """The writer meets only the stagers given it: another's snapshot is copied once more, and
    each checkpoint is still its step."""
    run = Run(tmp_path, linked=False, concurrency=2)
    try:
        want = {}
        for i in range(3):
            run.step()
            want[i] = model_state(run)
            run.save(f"s{i}").upload_completion.result()
        for i in range(3):
            assert equal(loaded(tmp_path / f"s{i}", want[i]), want[i]), i
        assert set(run.writer.named.checkpointer.stats["modes"]) == {"staged"}  # written through its own staging
    finally:
        run.close()


def two_ranks(mode: str, directory) -> list[str]:
    port, procs = free_port(), []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PYTHONPATH=python_path(ROOT, WORKERS))
        procs.append(warm.popen([sys.executable, os.path.join(WORKERS, "stager_worker.py"), mode,
                                 str(directory)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env))
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]
    return outs


@pytest.mark.parametrize("mode, said", [
    ("skip", ("skipped", "skipped")),
    ("wait", ("refused: no staging slot became free in 3 s on another rank",
              "refused: no staging slot became free in 3 s on this rank"))])
def test_a_save_without_a_slot_on_one_rank_is_skipped_or_refused_on_every_rank(tmp_path, mode, said):
    outs = two_ranks(mode, tmp_path)  # only rank 1's slot was taken (with 'wait': for 3 s, in vain)
    for out, expected in zip(outs, said):
        assert expected in out and "saved 2" not in out and "saved 3" in out, out
    assert sorted(os.listdir(tmp_path)) == ["step-3"]


def test_a_copy_failing_on_one_rank_fails_that_save_on_both_before_dcps_collectives(tmp_path):
    outs = two_ranks("fail", tmp_path)
    assert "failed RuntimeError: injected" in outs[1], outs[1]
    assert "failed CheckpointWriteError: another rank could not stage" in outs[0], outs[0]
    for out in outs:
        assert "saved 3" not in out and "saved 4" in out, out
    assert sorted(os.listdir(tmp_path)) == ["step-1", "step-2", "step-4"]


def test_a_snapshot_taken_by_its_save_thread_answers_anyone_else_without_raising(tmp_path):
    """DCP's own callback may ask for the result after the save thread took the snapshot over."""
    run = Run(tmp_path)
    try:
        run.step()
        future = run.stager.stage(run.state())
        got: list = []
        taker = threading.Thread(target=lambda: got.append(future.result()))
        taker.start()
        taker.join(30)
        assert isinstance(got[0], dict) and future.result() is None
        del got
    finally:
        run.close()


def test_a_snapshot_let_go_of_frees_its_slot_though_the_stagers_thread_has_not_yet_returned(tmp_path, monkeypatch):
    """policy 'skip': the caller takes its snapshot and drops it, then stages again at once. The
    stager's thread, which resolved the future, still holds the snapshot until it returns (held
    here for 0.5 s after resolving it): the slot is about to be free, not in flight, and the
    second stage() must not be skipped for it (on a loaded machine it once was, in CI)."""
    from fastckpt.dcp.slots import StagedFuture
    resolve = StagedFuture.set_result

    def resolved_then_descheduled(future, result):
        resolve(future, result)
        if threading.current_thread().name.startswith("fastckpt-dcp-stage"):
            time.sleep(0.5)

    monkeypatch.setattr(StagedFuture, "set_result", resolved_then_descheduled)
    run = Run(tmp_path, concurrency=1, policy="skip")
    try:
        run.step()
        kept = run.stager.stage(run.state()).result()
        assert isinstance(kept, dict)
        del kept
        run.step()
        again = run.stager.stage(run.state()).result()  # SaveSkipped while the thread was returning
        assert isinstance(again, dict) and run.stager.stats["skipped"] == 0
        del again
    finally:
        run.close()


def test_a_snapshot_without_tensors_frees_its_slot_when_taken_where_it_was_staged(tmp_path):
    run = Run(tmp_path, concurrency=1, commit_timeout_s=5)
    try:
        for i in range(3):  # one slot: each must be free again at once, not after the 5 s timeout
            assert run.stager.stage({"step": i, "note": "x"}).result() == {"step": i, "note": "x"}
    finally:
        run.close()


def test_an_agreement_that_fails_fails_that_save_and_hangs_nothing(tmp_path, monkeypatch):
    run = Run(tmp_path, concurrency=1)
    try:
        run.step()

        def gone(ok, background=False):
            raise RuntimeError("the peer is gone (gloo timeout)")

        monkeypatch.setattr(run.stager._agree, "all_ok", gone)
        with pytest.raises(RuntimeError, match="peer is gone"):
            run.save("lost").upload_completion.result()
        monkeypatch.undo()
        run.step()
        run.save("next").upload_completion.result()  # the slot was given back
    finally:
        run.close()


def test_a_slot_moves_one_way_and_back_to_free():
    from fastckpt.dcp.slots import Slot, SlotState as S
    from fastckpt.write.snapshot_buffers import SnapshotBuffers
    slot = Slot(SnapshotBuffers(device_copy=False), 0)
    with pytest.raises(RuntimeError, match="from FREE to COPIED"):
        slot.to(S.COPIED)
    for state in (S.STAGING, S.COPIED, S.COPIED, S.DELIVERED):
        slot.to(state)
    assert slot.busy and slot.copied and slot.delivered
    for back in (S.STAGING, S.COPIED):
        with pytest.raises(RuntimeError, match=f"from DELIVERED to {back.name}"):
            slot.to(back)
    slot.to(S.FREE)
    assert not slot.busy and not slot.copied and not slot.delivered


def test_the_writers_staging_is_reserved_at_the_first_save_so_live_saves_find_it_ready(tmp_path):
    """FastStager 'c' given its writer copies its first saves itself (trust not yet earned); the
    writer then grows its own staging for the file in the background, so the saves that hand the
    optimizer's tensors on live find it ready instead of growing it on the training thread's gate."""
    run = Run(tmp_path)
    try:
        run.step()
        run.save("first").upload_completion.result()
        ck = run.writer.named.checkpointer
        assert ck._staging is not None
        ck._staging.wait_grown()  # it runs in the background; here we wait to look
        grown = ck._engine.pool.capacity
        assert grown >= 1
        run.trained_and_trusted()  # later saves: handed on live, copied by the writer
        assert run.stager.stats["copied_by_writer"] > 0
        assert ck._engine.pool.capacity == grown  # the live saves found their staging ready
    finally:
        run.close()

