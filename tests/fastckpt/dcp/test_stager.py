"""FastStager under real dcp.async_save and FastStorageWriter: async_save returns before the
optimizer's tensors are copied and the optimizer step waits for the writer's save to copy them
(the checkpoint holds the state of the save, not of the step after it); a tensor written in place
by anything else before that copy fails that save (TornSnapshotError) and nothing of it is
committed; never more than `concurrency` snapshots are staged or written, and one staged while an
earlier one is still saved, or for another writer, is copied whole before async_save returns;
policy='skip' raises SaveSkipped, agreed on 2 gloo ranks; a copy failing on one rank fails that
save on both, before DCP's collectives. The writer's copy is held deterministically by making
its save wait on an event before it begins."""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from fastckpt.dcp import FastStager, FastStorageReader, FastStorageWriter, SaveSkipped
from fastckpt.errors import CheckpointWriteError, ConfigError
from support import warm
from support.paths import ROOT, WORKERS, python_path
from support.processes import free_port

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class Held:
    """The save of the writer a stager hands the optimizer's tensors to waits until release(),
    before it begins (on an async_save's thread; a plain dcp.save on the caller's does not)."""

    def __init__(self, monkeypatch):
        self.go, self.waiting = threading.Event(), threading.Event()
        real_begin = FastStorageWriter._begin_file

        def begin(writer, plan, planner, name, path):
            if threading.current_thread() is not threading.main_thread():  # an async_save's thread
                self.waiting.set()
                assert self.go.wait(60)
            return real_begin(writer, plan, planner, name, path)

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
        self.linked = linked
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
        """Steps and saves until the run has earned trust: the optimizer's tensors are copied by
        the writer's save after async_save returns (before, each save waited for that copy)."""
        for i in range(3):
            self.step()
            self.save(f"warm-{i}").upload_completion.result()
        assert self.stager.stats["handed_on" if self.linked else "copied_whole"] > 0

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


@pytest.mark.parametrize("strategy", ["c", "g", "d"])
def test_async_save_returns_before_the_copy_and_the_optimizer_step_waits_for_it(tmp_path, monkeypatch, strategy):
    """Handed on live, the optimizer's tensors are copied by the writer's save with the stager's
    strategy ('d': written straight from them); the step waits for that."""
    run = Run(tmp_path, strategy=strategy)
    try:
        run.trained_and_trusted()
        held = Held(monkeypatch)
        before = model_state(run)
        saving = run.save("held")
        assert held.waiting.wait(30)  # async_save returned; the writer's save waits to copy
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
        assert run.stager.stats["copied_by_writer"] == run.stager.stats["handed_on"] > 0
    finally:
        run.close()


def test_before_the_run_has_earned_trust_the_snapshot_is_copied_before_async_save_returns(tmp_path, monkeypatch):
    """The first save after a step (trust not yet earned) is copied whole at stage(): a tensor
    written in place after async_save returned, while the writer's save has not begun, does not
    reach the checkpoint (and fails nothing)."""
    run = Run(tmp_path)
    try:
        run.step()
        before = model_state(run)
        held = Held(monkeypatch)
        saving = run.save("first")
        assert held.waiting.wait(30)
        assert run.stager.stats["copied_whole"] == 1 and run.stager.stats["handed_on"] == 0
        with torch.no_grad():
            run.model[0].weight.add_(1.0)
        held.release()
        saving.upload_completion.result()
        assert equal(loaded(tmp_path / "first", before), before)
    finally:
        run.close()


@pytest.mark.parametrize("linked", [True, False], ids=["handed-to-the-writer", "copied-whole"])
def test_a_tensor_written_in_place_after_async_save(tmp_path, monkeypatch, linked):
    """Handed on live, before the writer's copy: that save fails and commits nothing. Copied whole
    at stage() (a stager not given the writer): the checkpoint holds the value of the save."""
    run = Run(tmp_path, linked=linked)
    try:
        run.trained_and_trusted()
        good = model_state(run)
        run.save("good").upload_completion.result()
        held = Held(monkeypatch)
        saving = run.save("torn")
        assert held.waiting.wait(30) if linked else True
        with torch.no_grad():
            run.model[0].weight.add_(1.0)  # not the optimizer: the gate does not order this
        held.release()
        if linked:  # found by the writer that copies the live tensors: in DCP's write step, which wraps it
            with pytest.raises(CheckpointException, match=r"model\.0\.weight was written in place"):
                saving.upload_completion.result()
            with pytest.raises(CheckpointException):  # never committed, never half-loaded
                loaded(tmp_path / "torn", good)
        else:
            saving.upload_completion.result()
            assert equal(loaded(tmp_path / "torn", good), good)
        assert equal(loaded(tmp_path / "good", good), good)
        run.step()
        run.save("after").upload_completion.result()  # the stager goes on
    finally:
        run.close()


@pytest.mark.parametrize("strategy", ["c", "g", "d"])
def test_at_most_concurrency_snapshots_exist_and_each_checkpoint_is_its_step(tmp_path, strategy):
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
        assert all(s.finished() for s in run.stager._slots.every())  # each save let go of its snapshot when done
        for i in range(6):
            assert equal(loaded(tmp_path / f"s{i}", want[i]), want[i]), i
        stats = run.stager.stats  # each snapshot handed on live (the writer's copy credited to it) or copied whole
        assert stats["staged"] == 6 == stats["handed_on"] + stats["copied_whole"], stats
        assert stats["copied_by_writer"] == stats["handed_on"], stats
    finally:
        run.close()


def test_a_snapshot_staged_while_an_earlier_one_is_saved_is_copied_whole(tmp_path, monkeypatch):
    """The earlier save's writer waits (held): the next snapshot cannot be handed to the writer
    soon, so it is copied before async_save returns (the step after it waits for no save of its
    own), and written from that copy as it lies."""
    run = Run(tmp_path, concurrency=2)
    try:
        run.trained_and_trusted()
        held = Held(monkeypatch)
        want = model_state(run)
        first = run.save("first")
        assert held.waiting.wait(30)
        handed_on, whole = run.stager.stats["handed_on"], run.stager.stats["copied_whole"]
        direct = run.writer.named.checkpointer.stats["modes"].get("direct", 0)
        second = run.save("second")
        assert run.stager.stats["handed_on"] == handed_on and run.stager.stats["copied_whole"] == whole + 1
        held.release()
        for saving in (first, second):
            saving.upload_completion.result()
        for name in ("first", "second"):
            assert equal(loaded(tmp_path / name, want), want), name
        assert run.writer.named.checkpointer.stats["modes"].get("direct", 0) == direct + 1  # the copy, as it lies
    finally:
        run.close()


def test_asked_from_a_saves_thread_snapshot_of_names_that_saves_own_snapshot(tmp_path):
    """Snapshots handed on live one after the other hold the same tensors: asked from a save's
    thread (DCP writes on the thread that took the snapshot), snapshot_of names that save's own,
    never the earlier one (the writer would credit its copy to it, and the gate hold this save's
    step until written): the earlier one's slot was given back before the next was taken."""
    run = Run(tmp_path, concurrency=2)
    try:
        run.trained_and_trusted()
        run.step()
        weight, found = run.model[0].weight, {}

        def take(name: str, future) -> None:
            snapshot = future.result()  # this thread takes the snapshot over, as DCP's save thread does
            slot = run.stager.snapshot_of(weight)
            found[name] = (slot.seq, bool(slot.live)) if slot is not None else None
            del snapshot

        staged = []
        for name in ("first", "second"):  # each staged once the one before is done with
            staged.append(run.stager._seq)
            t = threading.Thread(target=take, args=(name, run.stager.stage(run.state())))
            t.start()
            t.join(30)
        assert found == {"first": (staged[0], True), "second": (staged[1], True)}
    finally:
        run.close()


def test_a_snapshot_finished_while_the_next_is_staged_is_not_credited_with_its_copy(tmp_path, monkeypatch):
    """Snapshot A's save ends while B's stage() waits in its agreement across ranks: B is handed on
    live, and asked from B's save thread, snapshot_of names B, not A (A's would give B's writer
    A's torn verdict and credit A with B's copy, and B's gate would wait for B's whole save)."""
    run = Run(tmp_path, concurrency=2)
    try:
        run.trained_and_trusted()
        run.step()
        weight, let_go, found = run.model[0].weight, threading.Event(), {}

        def take(name: str, future, keep: bool) -> None:
            snapshot = future.result()  # this thread takes the snapshot over, as DCP's save thread does
            slot = run.stager.snapshot_of(weight)
            found[name] = (slot.seq, bool(slot.live)) if slot is not None else None
            if keep:
                assert let_go.wait(30)
            del snapshot

        seq_a = run.stager._seq
        a = threading.Thread(target=take, args=("a", run.stager.stage(run.state()), True))
        a.start()
        real = run.stager._agree.all_min

        def all_min(values: list) -> list:
            if a.is_alive():  # A's save ends now, in B's first agreement (every rank's slot)
                let_go.set()
                a.join(30)
            return real(values)

        monkeypatch.setattr(run.stager._agree, "all_min", all_min)
        handed_on, seq_b = run.stager.stats["handed_on"], run.stager._seq
        b = threading.Thread(target=take, args=("b", run.stager.stage(run.state()), False))
        b.start()
        b.join(30)
        assert run.stager.stats["handed_on"] == handed_on + 1
        assert found == {"a": (seq_a, True), "b": (seq_b, True)}
    finally:
        run.close()


@pytest.mark.parametrize("linked", [True, False], ids=["for-its-writer", "for-another"])
def test_a_snapshot_copied_whole_is_page_aligned_and_a_storage_of_its_own(tmp_path, linked):
    """Copied whole (before trust): into memory O_DIRECT moves fastest for its writer, else plain pages."""
    run = Run(tmp_path, linked=linked)
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
    """The writer meets only the stagers given it: another's snapshot (copied whole at stage())
    is copied once more, and each checkpoint is still its step."""
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
        assert run.stager.stats["copied_whole"] == 3 and run.stager.stats["handed_on"] == 0
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
    ("wait", ("refused: no staging slot became free on another rank, nothing moved for 3 s",
              "refused: no staging slot became free on this rank, nothing moved for 3 s"))])
def test_a_save_without_a_slot_on_one_rank_is_skipped_or_refused_on_every_rank(tmp_path, mode, said):
    outs = two_ranks(mode, tmp_path)  # only rank 1's slot was taken (with 'wait': for 3 s, in vain)
    for out, expected in zip(outs, said):
        assert expected in out and "saved 2" not in out and "saved 3" in out, out
    assert sorted(os.listdir(tmp_path)) == ["step-3"]


def test_ranks_wait_for_a_slot_in_agreed_rounds_past_the_agreements_timeout_while_the_saves_move(tmp_path):
    """One rank waits 7 s for its slot behind a save that still moves; the other, which had one at
    once, waits with it round after round (2 s each) instead of timing out in the agreement (4 s)."""
    outs = two_ranks("rounds", tmp_path)
    for out in outs:
        assert "saved 2" in out and "saved 3" in out, out
    assert sorted(os.listdir(tmp_path)) == ["step-2", "step-3"]


def test_a_rank_that_writes_none_of_its_live_tensors_lets_its_step_go_once_its_own_save_copied(tmp_path):
    """DCP plans a replicated tensor on one rank only: the other rank's writer copies nothing of
    its snapshot, and credits it all the same, so that rank's step does not wait for the whole save."""
    outs = two_ranks("replicated", tmp_path)
    idle = [out for out in outs if "planned tensors False" in out]
    assert len(idle) == 1 and all("handed on 3" in out for out in outs), outs
    assert "stepped before the save ended" in idle[0], idle[0]


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


def test_a_snapshot_let_go_of_frees_its_slot_at_once(tmp_path):
    """policy 'skip', one slot: the caller takes its snapshot and drops it, then stages again at
    once; that slot is free, not in flight, and the second stage() is not skipped for it."""
    run = Run(tmp_path, concurrency=1, policy="skip")
    try:
        for _ in range(3):
            run.step()
            kept = run.stager.stage(run.state()).result()
            assert isinstance(kept, dict)
            del kept
        assert run.stager.stats["skipped"] == 0 and run.stager.stats["staged"] == 3
    finally:
        run.close()


def test_a_snapshot_without_tensors_frees_its_slot_when_taken_where_it_was_staged(tmp_path):
    run = Run(tmp_path, concurrency=1, stall_timeout_s=2, commit_timeout_s=3)
    try:
        for i in range(3):  # one slot: each must be free again at once, not refused after 5 s of waiting
            assert run.stager.stage({"step": i, "note": "x"}).result() == {"step": i, "note": "x"}
    finally:
        run.close()


@pytest.mark.parametrize("agreement", ["all_min", "all_ok"], ids=["every-rank-has-a-slot", "every-copy-succeeded"])
def test_an_agreement_that_fails_fails_that_save_and_hangs_nothing(tmp_path, monkeypatch, agreement):
    run = Run(tmp_path, concurrency=1)
    try:
        run.step()

        def gone(*args, **kwargs):
            raise RuntimeError("the peer is gone (gloo timeout)")

        monkeypatch.setattr(run.stager._agree, agreement, gone)
        with pytest.raises(RuntimeError, match="peer is gone"):
            run.save("lost").upload_completion.result()
        monkeypatch.undo()
        run.step()
        run.save("next").upload_completion.result()  # the slot was given back
    finally:
        run.close()


def test_the_writers_staging_is_reserved_at_the_first_save_so_live_saves_find_it_ready(tmp_path):
    """FastStager 'c' given its writer copies its first saves whole (trust not yet earned), which
    the writer writes as they lie; the writer then grows its own staging for the file in the
    background, so the saves that hand the optimizer's tensors on live find it ready instead of
    growing it on the training thread's gate."""
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


def test_a_slot_wait_lasts_while_the_writers_saves_move_and_is_refused_once_nothing_moves(tmp_path, monkeypatch):
    """FastStager waits as the Checkpointer does (write.deadline): for as long as its writer's saves
    move, past stall_timeout_s + commit_timeout_s; once nothing moved for that long, refused."""
    run = Run(tmp_path, concurrency=1, stall_timeout_s=0.5, commit_timeout_s=0.5)
    try:
        run.step()
        kept = [run.stager.stage(run.state()).result()]  # the only slot stays taken while referenced
        moved = itertools.count()
        monkeypatch.setattr(run.writer, "progress", lambda: next(moved))  # a slow save, moving
        threading.Timer(2.5, kept.clear).start()
        t0 = time.monotonic()
        run.stager.stage({"step": 1}).result()
        assert time.monotonic() - t0 >= 2.0 and run.stager.stats["staged"] == 2
        kept.append(run.stager.stage(run.state()).result())
        monkeypatch.setattr(run.writer, "progress", lambda: 7)  # stuck: nothing moves
        t0 = time.monotonic()
        with pytest.raises(CheckpointWriteError, match="no staging slot became free on this rank, nothing moved for 1 s"):
            run.stager.stage({"step": 2})
        assert 0.9 <= time.monotonic() - t0 < 10
        kept.clear()
    finally:
        run.close()
