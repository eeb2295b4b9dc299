"""Where a save's time went (fastckpt.timings): every phase a save ran is in its Pending's
timings and summed into the Checkpointer's stats, for the host write, the stream-read write
(HostStream standing in for a CUDA stream) and the pool.

What is checked is structure, not speed: which phases are there for each path, that the parts
of the save() call fit inside it, that the instants come in the order the write reaches them,
and that the stats are the sums of the saves' own figures.
"""
from __future__ import annotations

import os
import time

import pytest
import torch

import fastckpt
from fastckpt.timings import AFTER, INSTANTS, PHASES, steady
from fastckpt.write.streams import STREAMS, HostStream

IN_SAVE = ("slot", "plan", "staging", "begin", "start")


def _state():
    g = torch.Generator().manual_seed(5)
    return {f"w{i}": torch.randn(1 << 18, generator=g) for i in range(6)}  # 6 MiB


def _saves(ck, n=3):
    out = []
    for step in range(1, n + 1):
        p = ck.save(_state(), step=step)
        ck.gate()
        p.wait()
        out.append(p.timings)
    return out


def _check_shape(t: dict, expect: set):
    assert set(t) <= set(PHASES) | set(INSTANTS), set(t) - set(PHASES) - set(INSTANTS)
    assert expect <= set(t), expect - set(t)
    assert all(v >= 0 for v in t.values()), t
    assert sum(t[k] for k in IN_SAVE if k in t) <= t["save"] + 1e-6
    assert t["copied_at"] <= t["written_at"] <= t["durable_at"]


def test_a_host_save_times_every_phase_and_the_stats_sum_them(tmp_path):
    with fastckpt.Checkpointer(tmp_path, strategy="c", chunk_mb=1, staging_mb=2, writers=1, keep=1) as ck:
        saves = _saves(ck)
        stats = dict(ck.stats["timings"])
        first, landed = ck.stats["timings_first"], ck.stats["landed"]
    for t in saves:
        _check_shape(t, set(IN_SAVE) | {"save", "gate", "copy", "chunk_wait", "crc", "put", "open", "finish",
                                        "commit", "copied_at", "written_at", "durable_at"})
        assert "enqueue" not in t and "stream_wait" not in t  # no stream on this path
    for phase, total in stats.items():
        if phase == "gate":  # timed by gate() around each Pending's own wait, as it happens
            assert total >= sum(t["gate"] for t in saves)
        elif phase in AFTER:  # after landing: in the stats alone
            assert not any(phase in t for t in saves)
        else:
            assert total == pytest.approx(sum(t.get(phase, 0.0) for t in saves), rel=1e-9, abs=1e-12), phase
    assert set(INSTANTS) <= set(stats)  # summed: the saves' latencies
    assert first == saves[0] | {"gate": first["gate"]} and landed == 3
    mean = steady([{"timings": stats, "timings_first": first, "landed": landed}])
    assert mean["put"] == pytest.approx((saves[1]["put"] + saves[2]["put"]) / 2)


def test_deleting_old_checkpoints_is_timed_in_the_stats_apart_from_every_save(tmp_path, monkeypatch):
    """keep=1: each save after the first removes the one before, once it landed. That takes disk
    time (a delete on a filesystem mounted with `discard` trims before it returns), so it is
    timed, in the stats' `retain`, and in no save's own (each removal slowed here by 0.2 s)."""
    from fastckpt.store.root_store import RootStore
    remove = RootStore.remove
    removed = []

    def slow_remove(store, path):
        remove(store, path)
        removed.append(os.path.basename(path))
        time.sleep(0.2)

    monkeypatch.setattr(RootStore, "remove", slow_remove)
    with fastckpt.Checkpointer(tmp_path, strategy="c", chunk_mb=1, keep=1) as ck:
        saves = _saves(ck)
    assert sorted(removed) == ["step-00000001.c000001", "step-00000002.c000002"]
    assert ck.stats["timings"]["retain"] >= 0.4
    assert not any("retain" in t for t in saves)
    assert steady([ck.stats])["retain"] >= 0.2  # per save after the first: what the benchmarks print


def test_a_stream_read_save_times_its_enqueue_and_stream_waits(tmp_path, monkeypatch):
    monkeypatch.setitem(STREAMS, "cpu", HostStream)
    with fastckpt.Checkpointer(tmp_path, strategy="c", chunk_mb=1, keep=1) as ck:
        saves = _saves(ck)
    for t in saves:
        _check_shape(t, set(IN_SAVE) | {"save", "stream_wait", "crc", "put", "finish", "commit",
                                        "copied_at", "written_at", "durable_at"})
        assert "copy" not in t  # the stream copies, not the native copy threads
    assert "enqueue" in saves[-1]  # staging has grown by the last save (the first went through spare memory)


def test_a_pool_save_times_its_stores(shm):
    root = os.path.join(shm, "pool")
    with fastckpt.Checkpointer(root, store="pmem", pool_mb=64, keep=1) as ck:
        saves = _saves(ck, 2)
    for t in saves:
        _check_shape(t, set(IN_SAVE) | {"save", "put", "commit", "copied_at", "written_at", "durable_at"})


def test_a_failed_save_still_says_where_its_time_went(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    with fastckpt.Checkpointer(tmp_path / "ck", store="path", chunk_mb=1, on_error="warn") as ck:
        with pytest.warns(UserWarning, match="cannot write"):
            p = ck.save(_state(), step=1, path=str(tmp_path / "a-file" / "x.pt"))
        ck.wait()
    assert isinstance(p.error, fastckpt.CheckpointWriteError)
    assert {"save", "begin", "durable_at"} <= set(p.timings) and "start" not in p.timings
