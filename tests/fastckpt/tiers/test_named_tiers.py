"""A memory tier in front of checkpoints named by path (fastckpt.store.named_tiers): through
NamedCheckpoints, a real Lightning Trainer with FastCheckpointIO(tiers=...), and a real 2-rank
DeepSpeed job with "tiers" in its entry.

What a load of a path reads: the memory copy of the file at the path (every CRC checked), the
path itself when the memory copy is damaged (named in a warning), older than the file there, or
gone; the newest save of a path whose copy to it was cut short by a kill -9. Removal, and the
settings that are refused. (A kill -9 campaign: test_named_tiers_campaign.py.)
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import warnings

import pytest
import torch

import fastckpt
from fastckpt.errors import ConfigError
from fastckpt.named import NamedCheckpoints
from support.paths import ROOT, python_path
from support.states import assert_same


def state(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(300, 1000, generator=g), "step": step}


@pytest.fixture
def memory(shm):
    return os.path.join(shm, "memory")


def saved(named: NamedCheckpoints, tmp_path, steps_and_names) -> None:
    for step, name in steps_and_names:
        named.save(state(step), str(tmp_path / name), step)
    named.close()  # every copy to its path landed


def test_a_path_is_read_from_the_memory_copy_of_the_file_there(tmp_path, memory):
    named = NamedCheckpoints.by_path({"tiers": [memory], "tier_keep": [2]})
    saved(named, tmp_path, [(1, "a.ckpt"), (2, "b.ckpt"), (3, "last.ckpt")])
    assert sorted(os.listdir(tmp_path)) == ["a.ckpt", "b.ckpt", "last.ckpt"]  # every path reached its disk
    for step, name in [(3, "last.ckpt"), (2, "b.ckpt"), (1, "a.ckpt")]:
        assert_same(state(step), named.load(str(tmp_path / name)))
        assert_same(state(step), fastckpt.load(str(tmp_path / name)))  # an ordinary file on disk
    assert [(os.path.basename(r.path), r.tier) for r in named.reads] == [
        ("last.ckpt", "memory"), ("b.ckpt", "memory"), ("a.ckpt", "disk")]  # the memory tier keeps 2


def test_a_state_loaded_from_a_memory_copy_never_changes_when_later_saves_recycle_its_file(tmp_path, memory):
    """A load maps the memory copy (zero-copy views); later saves remove it and recycle part files.
    The loaded tensors keep their bytes: a lent copy's file is deleted, never written over."""
    named = NamedCheckpoints.by_path({"tiers": [memory], "tier_keep": [1]})
    named.save(state(1), str(tmp_path / "last.ckpt"), 1)
    named.wait()
    loaded = named.load(str(tmp_path / "last.ckpt"))
    assert named.reads[-1].tier == "memory"
    for step in range(2, 6):
        named.save(state(step), str(tmp_path / "last.ckpt"), step)
        named.wait()
    recycled = named._ck.store.memory.recycled
    named.close()
    assert recycled >= 2  # later parts were recycled: just not the loaded one
    assert_same(state(1), loaded)


def test_a_save_is_placed_once_persisted_to_its_path_not_when_committed_in_memory(tmp_path, memory, monkeypatch):
    """What a DeepSpeed tag's record waits for (fastckpt.commit.file_sets): the file at its path.
    The copy to the path is held; the save is committed (in memory) but not placed until it lands."""
    import threading
    from fastckpt.store import path_tier
    go, real = threading.Event(), path_tier.copy_part
    monkeypatch.setattr(path_tier, "copy_part", lambda *a, **k: (go.wait(60), real(*a, **k)))
    named = NamedCheckpoints.by_path({"tiers": [memory]})
    pending = named.save(state(1), str(tmp_path / "last.ckpt"), 1)
    assert pending.wait() is not None  # committed in memory
    assert not pending.wait_placed(0.3) and not os.path.exists(tmp_path / "last.ckpt")
    assert_same(state(1), named.load(str(tmp_path / "last.ckpt")))  # the newest save, from memory
    go.set()
    assert pending.wait_placed(60) and pending.placed_error is None
    assert_same(state(1), fastckpt.load(str(tmp_path / "last.ckpt")))
    named.close()


def test_a_save_whose_memory_copy_is_gone_before_its_copy_to_the_path_is_a_loud_error(tmp_path, memory, monkeypatch):
    """Not removed by its owner, yet not copied to its path: the path never gets that save. That is
    reported (a write error naming the path), never counted away as a superseded copy."""
    from fastckpt.store import named_tiers
    monkeypatch.setattr(named_tiers, "record_present", lambda folder: None)  # the copy vanished meanwhile
    named = NamedCheckpoints.by_path({"tiers": [memory]})
    target = str(tmp_path / "epoch=1-step=9.ckpt")
    pending = named.save(state(1), target, 1)
    assert pending.wait_placed(60)
    assert isinstance(pending.placed_error, fastckpt.CheckpointWriteError)
    assert target in str(pending.placed_error) and "was gone" in str(pending.placed_error)
    with pytest.raises(fastckpt.CheckpointWriteError, match="was not persisted"):
        named.close()
    assert not os.path.exists(target)


def test_a_damaged_memory_copy_is_named_and_the_path_is_read(tmp_path, memory):
    named = NamedCheckpoints.by_path({"tiers": [memory]})
    saved(named, tmp_path, [(1, "last.ckpt")])
    (info, file), = named._store.copies_of(str(tmp_path / "last.ckpt"))
    with open(file, "r+b") as f:
        f.seek(os.path.getsize(file) // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert_same(state(1), named.load(str(tmp_path / "last.ckpt")))
    about = [str(w.message) for w in said if "does not verify" in str(w.message)]
    assert len(about) == 1 and file in about[0] and str(tmp_path / "last.ckpt") in about[0]
    assert named.reads[-1].tier == "disk"


def test_a_path_saved_again_by_another_writer_is_read_from_the_path(tmp_path, memory):
    named = NamedCheckpoints.by_path({"tiers": [memory]})
    saved(named, tmp_path, [(1, "last.ckpt")])
    torch.save(state(7), str(tmp_path / "last.ckpt"))  # Lightning's own IO, a later run without tiers
    assert named.load(str(tmp_path / "last.ckpt"))["step"] == 7 and named.reads[-1].tier == "disk"


def test_removing_a_path_removes_its_memory_copies(tmp_path, memory):
    named = NamedCheckpoints.by_path({"tiers": [memory], "tier_keep": [3]})
    saved(named, tmp_path, [(1, "a.ckpt"), (2, "b.ckpt")])
    named.remove(str(tmp_path / "a.ckpt"))
    assert not os.path.exists(tmp_path / "a.ckpt")
    assert named._store.copies_of(str(tmp_path / "a.ckpt")) == []
    assert len(named._store.copies_of(str(tmp_path / "b.ckpt"))) == 1
    with pytest.raises(FileNotFoundError):
        named.load(str(tmp_path / "a.ckpt"))


KILLED_BEFORE_THE_COPY = """
import os, signal, sys, torch
from fastckpt.named import NamedCheckpoints
path, memory = sys.argv[1], sys.argv[2]
def state(step):
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(300, 1000, generator=g), "step": step}
named = NamedCheckpoints.by_path({"tiers": [memory]})
named.save(state(1), path, 1)
named.close()  # step 1: in memory and on disk
named.checkpointer.store.persist_unit = lambda *a, **k: None  # step 2's copy to the path never starts
named.save(state(2), path, 2).wait()  # committed in memory
print("committed", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_after_a_kill_before_its_copy_the_newest_save_of_a_path_is_read_from_memory(tmp_path, memory):
    path = str(tmp_path / "last.ckpt")
    child = subprocess.run([sys.executable, "-c", KILLED_BEFORE_THE_COPY, path, memory], capture_output=True,
                           text=True, timeout=120, env=dict(os.environ, PYTHONPATH=python_path(ROOT)))
    assert child.returncode == -signal.SIGKILL and "committed" in child.stdout, child.stderr[-3000:]
    assert fastckpt.load(path)["step"] == 1  # the disk holds the older save
    named = NamedCheckpoints.by_path({"tiers": [memory]})
    assert_same(state(2), named.load(path))
    assert named.reads[-1].tier == "memory"


@pytest.mark.parametrize("make, says", [
    (lambda m: fastckpt.Checkpointer(store="path", tiers=[m, "/d"]), "one place"),
    (lambda m: fastckpt.Checkpointer(store="path", tiers=[m], replicas=1), "replicas need store='root'"),
    (lambda m: fastckpt.Checkpointer(store="path", tiers=[m], tier_keep=[0]), "tier_keep"),
    (lambda m: NamedCheckpoints.by_path({"tiers": [m]}, pool="/dev/shm/p.pool"), "tiers and pool"),
    (lambda m: __import__("lightning_fastckpt").FastCheckpointIO(tiers=[m], per_rank=True), "per_rank"),
])
def test_bad_settings_are_one_line_errors(memory, make, says):
    with pytest.raises(ConfigError, match=says) as got:
        make(memory)
    assert "\n" not in str(got.value)


@pytest.mark.slow
def test_lightning_resumes_from_the_memory_copy_of_last_ckpt(tmp_path, memory):
    """A real Trainer with ModelCheckpoint (top-k + last) through FastCheckpointIO(tiers=...): the
    files Lightning expects are on disk; a resume from last.ckpt reads its memory copy and trains
    on; removals dropped their memory copies too."""
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning_fastckpt import FastCheckpointIO
    from workers.lit_app import TinyModule, loader, trainer
    ck = tmp_path / "ck"
    io = FastCheckpointIO(tiers=[memory], tier_keep=[2])
    t = trainer(io, max_steps=12, callbacks=[ModelCheckpoint(dirpath=ck, every_n_train_steps=3, save_top_k=2,
                                                             monitor="loss", save_last=True)])
    t.fit(TinyModule(), loader(), loader())
    on_disk = sorted(os.listdir(ck))
    kept = sorted(os.path.basename(p) for p in t.checkpoint_callback.best_k_models)
    assert len(kept) == 2 and on_disk == sorted(kept + ["last.ckpt"]), (  # what to look at if this ever fails again
        on_disk, kept, [{k: v for k, v in s.items() if k.startswith(("persist", "failed", "landed"))}
                        for s in io.named.closed_stats], sorted(os.listdir(os.path.join(memory, "rank-0"))))
    held = {json_target for json_target in targets(memory)}
    assert held <= {str(ck / n) for n in on_disk}  # nothing removed lingers in memory
    io2 = FastCheckpointIO(tiers=[memory], tier_keep=[2])
    t2 = trainer(io2, max_steps=15)
    t2.fit(TinyModule(), loader(), loader(), ckpt_path=str(ck / "last.ckpt"))
    assert t2.global_step == 15
    assert [(os.path.basename(r.path), r.tier) for r in io2.named.reads][:1] == [("last.ckpt", "memory")]


def targets(memory: str) -> list[str]:
    """The path each committed memory copy is a copy of."""
    out = []
    for rank in os.listdir(memory):
        for name in os.listdir(os.path.join(memory, rank)):
            target = os.path.join(memory, rank, name, "TARGET")
            if os.path.exists(os.path.join(memory, rank, name, "COMMIT")) and os.path.exists(target):
                out.append(open(target).read())
    return out


@pytest.mark.slow
def test_deepspeed_resumes_bit_exact_from_its_memory_tier_on_two_ranks(tmp_path, memory):
    """"tiers" in the DeepSpeed entry: every file of a tag is committed in its rank's memory
    folder, then persisted to the tag folder (an ordinary DeepSpeed tag on disk); a resume on two
    ranks reads the files from memory and is bit-exact."""
    pytest.importorskip("deepspeed")
    from support.deepspeed_runs import assert_resumed_exactly, run
    entry = json.dumps({"tiers": [memory], "tier_keep": [2], "concurrency": 2})
    trained = run("train", tmp_path / "ck", tmp_path / "a.pt", "--stage", "1", ranks=2, FASTCKPT_ENTRY=entry)
    tag = tmp_path / "ck" / "global_step3"
    assert os.path.isfile(tag / "COMMIT") and os.path.getsize(tag / "mp_rank_00_model_states.pt") > 1024
    resumed = run("resume", tmp_path / "ck", tmp_path / "b.pt", "--stage", "1", ranks=2, FASTCKPT_ENTRY=entry)
    assert_resumed_exactly(trained, resumed)
    assert resumed["read_from"] == ["memory"], resumed["read_from"]


def test_the_docs_calls_are_the_ones_these_tests_make():
    """docs/tiers.md's block for Lightning's and DeepSpeed's paths runs as written (test_first_hour);
    its FastCheckpointIO call, with its keyword names, is one this file makes."""
    from support import readme_blocks
    missing = readme_blocks.calls_not_in(os.path.join(ROOT, "docs", "tiers.md"), "In front of Lightning's and "
                                         "DeepSpeed's paths", "", os.path.abspath(__file__), ("FastCheckpointIO",))
    assert not missing, missing
