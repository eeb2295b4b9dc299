"""Checkpointer behaviour: async saves, gate, concurrency, keep, latest, fallback, policy."""
from __future__ import annotations

import os
import threading

import pytest
import torch

import fastckpt
from support.states import assert_same, assert_sharing, state_matrix


def model_state(seed: int, n: int = 4) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {f"w{i}": torch.randn(256, 256, generator=g) for i in range(n)} | {"step": seed}


@pytest.mark.parametrize("strategy", ["c", "g", "d"])
@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
def test_save_load_matrix(tmp_path, strategy, fmt):
    state = state_matrix()
    with fastckpt.Checkpointer(tmp_path, strategy=strategy, format=fmt, chunk_mb=1) as ck:
        p = ck.save(state, step=7)
        info = p.wait()
        assert info.step == 7 and info.bytes == os.path.getsize(info.file_for(0))
        out = ck.load()
    assert_same(state, out)
    assert_sharing(out)
    if fmt == "torch":
        assert_same(state, torch.load(info.file_for(0), weights_only=True))


def test_concurrent_saves_commit_in_order_and_keep(tmp_path):
    with fastckpt.Checkpointer(tmp_path, concurrency=3, keep=2, chunk_mb=1) as ck:
        pendings = [ck.save(model_state(s), step=s) for s in range(1, 8)]
        ck.wait()
        assert [p.wait().step for p in pendings] == list(range(1, 8))
        assert ck.latest().step == 7
        assert [c.step for c in ck.list()] == [7, 6]
        assert ck.load()["step"] == 7
        assert ck.load(step=6)["step"] == 6
    latest = open(tmp_path / "latest").read()
    assert '"step": 7' in latest


def test_gate_means_snapshot_is_taken(tmp_path):
    """Overwriting tensors after gate() must not change what was saved."""
    state = model_state(1, n=8)
    expect = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    with fastckpt.Checkpointer(tmp_path, strategy="c", chunk_mb=1, staging_mb=64) as ck:
        p = ck.save(state, step=1)
        ck.gate()
        assert p.copied()
        for v in state.values():
            if isinstance(v, torch.Tensor):
                v.fill_(-1.0)
        p.wait()
        out = ck.load()
    assert_same(expect, out)


def test_staging_smaller_than_state_streams_through(tmp_path):
    state = model_state(2, n=8)  # 2 MiB; staging 1 chunk of 1 MiB
    with fastckpt.Checkpointer(tmp_path, chunk_mb=1, staging_mb=1, concurrency=2) as ck:
        for s in range(3):
            ck.save(state, step=s)
        ck.wait()
        assert ck._engine.pool.capacity == 1
        assert_same(state, ck.load())


def test_reserve_faults_staging_in_ahead_of_the_first_save(tmp_path):
    state = {"w": torch.randn(3 << 20)}  # 12 MiB: three 4 MiB chunks
    with fastckpt.Checkpointer(tmp_path, chunk_mb=4, concurrency=2) as ck:
        ck.reserve(state["w"].nbytes)
        ck._staging.wait_grown()  # it runs in the background; here we wait to look
        pool = ck._engine.pool
        assert pool.capacity == 3
        ck.save(state, step=1).wait()
        assert pool.capacity == 3  # the save found its staging ready
        ck.reserve(1 << 30)  # once per Checkpointer
        assert pool.capacity == 3
        assert_same(ck.load(), state)


@pytest.mark.parametrize("strategy", ["c", "d"])
def test_a_file_without_tensor_data_is_written_every_time(tmp_path, strategy):
    """No data chunk to write: the file is still created by a writer thread, and finishing
    must wait for that (it once raced: "file was never opened", 89 of 300 saves)."""
    ck = fastckpt.Checkpointer(store="path", distributed=False, writers=1, strategy=strategy)
    try:
        for i in range(200):
            path = str(tmp_path / f"s{i % 3}.pt")
            ck.save({"step": i, "empty": torch.empty(0)}, step=i, path=path).wait()
            assert torch.load(path)["step"] == i
    finally:
        ck.close()


def test_skip_policy_drops_when_full(tmp_path):
    with fastckpt.Checkpointer(tmp_path, concurrency=1, policy="skip", strategy="d") as ck:
        first = ck.save(model_state(1, n=16), step=1, held=True)  # in flight until released
        with pytest.warns(UserWarning, match="skipped"):
            skipped = ck.save(model_state(2), step=2)
        assert skipped.skipped and skipped.wait() is None
        first.release_all()
        assert first.wait().step == 1
        ck.wait()
        assert ck.stats["skipped"] == 1


def test_wait_policy_blocks_until_a_slot_frees(tmp_path):
    with fastckpt.Checkpointer(tmp_path, concurrency=1, strategy="d") as ck:
        a = ck.save(model_state(1, n=16), step=1)
        b = ck.save(model_state(2), step=2)  # waits for a's slot
        assert a.done()
        assert b.wait().step == 2


def test_a_save_of_its_own_strategy_is_written_so_and_a_bad_one_takes_nothing(tmp_path):
    """save(strategy=...) (a DCP snapshot that is already a private copy: 'd'): written with it; an
    unknown one is refused before a slot is taken (concurrency 1: the next save still goes)."""
    with fastckpt.Checkpointer(tmp_path, concurrency=1, policy="skip", strategy="c") as ck:
        with pytest.raises(ValueError, match="unknown strategy 'x'"):
            ck.save(model_state(1), step=1, strategy="x")
        assert ck.save(model_state(2), step=2, strategy="d").wait().step == 2
        assert ck.save(model_state(3), step=3).wait().step == 3
        assert ck.stats["modes"] == {"direct": 1, "staged": 1} and ck.stats["skipped"] == 0


def test_load_falls_back_past_a_corrupt_newest(tmp_path):
    with fastckpt.Checkpointer(tmp_path) as ck:
        ck.save(model_state(1), step=1).wait()
        info = ck.save(model_state(2), step=2).wait()
    path = info.file_for(0)
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x10]))
    ck = fastckpt.Checkpointer(tmp_path)
    with pytest.warns(UserWarning, match="corrupt"):
        out = ck.load()
    assert out["step"] == 1
    with pytest.raises(fastckpt.NoCheckpointError, match="step 2"):
        ck.load(step=2)


def test_truncated_file_is_not_latest(tmp_path):
    with fastckpt.Checkpointer(tmp_path) as ck:
        ck.save(model_state(1), step=1).wait()
        info = ck.save(model_state(2), step=2).wait()
    os.truncate(info.file_for(0), 1000)
    ck = fastckpt.Checkpointer(tmp_path)
    assert ck.latest().step == 1
    assert ck.load()["step"] == 1


def test_load_into_checks_shapes(tmp_path):
    model = torch.nn.Linear(8, 4)
    with fastckpt.Checkpointer(tmp_path) as ck:
        ck.save(model.state_dict(), step=1).wait()
        other = torch.nn.Linear(8, 4)
        ck.load(into=other.state_dict())
        assert torch.equal(other.weight, model.weight)
        with pytest.raises(fastckpt.StateMismatchError, match=r"weight: checkpoint has torch.float32\[4, 8\], expected torch.float32\[5, 8\]"):
            ck.load(into=torch.nn.Linear(8, 5).state_dict())


def test_empty_root_has_no_latest(tmp_path):
    ck = fastckpt.Checkpointer(tmp_path / "nothing")
    assert ck.latest() is None
    with pytest.raises(fastckpt.NoCheckpointError):
        ck.load()
    assert not (tmp_path / "nothing").exists()  # reading never creates anything


def test_no_threads_left_after_close(tmp_path):
    before = set(threading.enumerate())  # other tests' owners, never closed, may keep idle workers a while
    with fastckpt.Checkpointer(tmp_path, concurrency=2) as ck:
        for s in range(4):
            ck.save(model_state(s), step=s)
    assert not [t for t in threading.enumerate() if t.name.startswith("fastckpt") and t not in before]


def test_finished_checkpoints_are_not_kept_alive(tmp_path):
    import gc
    import weakref
    with fastckpt.Checkpointer(tmp_path, concurrency=2) as ck:
        first = ck.save(model_state(1, n=1), step=1)
        ref = weakref.ref(first)
        del first
        for s in range(2, 6):
            ck.save(model_state(s, n=1), step=s)
        ck.wait()
        gc.collect()
        assert ref() is None
