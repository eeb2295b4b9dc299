"""FastModelParallelStrategy: Lightning's ModelParallelStrategy (FSDP2) on 2 gloo ranks on CPU,
saving its distributed checkpoints through fastckpt.dcp (async_save, FastStager, the commit).
Every checkpoint ModelCheckpoint kept is committed with Lightning's meta.pt in its record; the
ones it rotated out are gone; a run resumed from a kept checkpoint — by our strategy, and by
Lightning's own ModelParallelStrategy (interop) — ends bit-equal to the uninterrupted run; a
checkpoint whose commit never happened is refused. FastCheckpointIO given to Lightning's own
ModelParallelStrategy (which bypasses a CheckpointIO for distributed checkpoints) says so."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from fastckpt.commit import record
from fastckpt.dcp import committed
from fastckpt.commit.record import COMMIT_NAME as RECORD
from support import readme_blocks, warm
from support.paths import ROOT, WORKERS, python_path
from support.processes import free_port

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
STEPS = 8


def two_ranks(out, *args, ok: bool = True) -> list[str]:
    port, procs = free_port(), []
    os.makedirs(out, exist_ok=True)
    for r in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", NODE_RANK="0",
                   LOCAL_RANK=str(r), RANK=str(r), OMP_NUM_THREADS="1", PYTHONPATH=python_path(ROOT, WORKERS))
        procs.append(warm.popen([sys.executable, os.path.join(WORKERS, "lit_mp_worker.py"), str(out),
                                 str(STEPS), *map(str, args)], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preload=("lightning",)))
    outs = [p.communicate(timeout=300)[0] for p in procs]
    if ok:
        for p, said in zip(procs, outs):
            assert p.returncode == 0, said[-4000:]
    return outs


def equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    return a == b


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("mp")
    said = two_ranks(out)
    for s in said:  # every save staged by the stager: handed on to its writer, or copied whole (one
        # staged while the one before was still written, as the steps of this small model are quick)
        stats = json.loads(s.split("stager ", 1)[1].splitlines()[0])
        assert stats["staged"] == STEPS // 2 == stats["handed_on"] + stats["copied_whole"], stats
        assert stats["failed"] == 0 and stats["copied_by_writer"] == stats["handed_on"], stats
    return out


def test_kept_checkpoints_are_committed_with_meta_and_the_rotated_ones_are_gone(uninterrupted):
    ck = uninterrupted / "ck"
    names = sorted(os.listdir(ck))
    assert names == ["epoch=2-step=6.ckpt", "epoch=3-step=8.ckpt"], names
    for name in names:
        info = record.read(str(ck / name), RECORD, every_rank=False)
        assert {f.name for f in info.files} == {".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"}
        assert info.world_size == 2 and info.step == int(name.split("step=")[1].split(".")[0])
    assert [os.path.basename(i.path) for i in committed(ck)] == ["epoch=3-step=8.ckpt", "epoch=2-step=6.ckpt"]


@pytest.mark.parametrize("stock", [False, True], ids=["ours", "lightnings-own"])
def test_a_run_resumed_from_a_kept_checkpoint_ends_bit_equal(uninterrupted, tmp_path, stock):
    ckpt = uninterrupted / "ck" / "epoch=2-step=6.ckpt"
    copy = tmp_path / "from" / ckpt.name
    shutil.copytree(ckpt, copy)
    said = two_ranks(tmp_path / "resumed", "--resume", copy, *(["--stock"] if stock else []))
    assert all(f"done {STEPS}" in s for s in said), said
    want = torch.load(uninterrupted / "final.pt", weights_only=True)
    got = torch.load(tmp_path / "resumed" / "final.pt", weights_only=True)
    assert equal(got, want)


def test_a_checkpoint_whose_commit_never_happened_is_refused(uninterrupted, tmp_path):
    copy = tmp_path / "cut" / "epoch=2-step=6.ckpt"
    shutil.copytree(uninterrupted / "ck" / "epoch=2-step=6.ckpt", copy)
    os.remove(copy / RECORD)  # killed after .metadata, before the record
    said = two_ranks(tmp_path / "resumed", "--resume", copy, ok=False)
    assert any("never committed" in s for s in said), said[0][-3000:]


def test_fastcheckpointio_given_to_a_strategy_that_bypasses_it_says_so(tmp_path):
    said = two_ranks(tmp_path, "--stock", "--io")
    assert "saves its distributed checkpoints itself with PyTorch DCP, not through FastCheckpointIO" in said[0], \
        said[0][-3000:]
    assert "FastModelParallelStrategy" in said[0]
    # rotation still works (the removed directory's name is gone at once; its files are freed in the
    # background, which this worker's os._exit may cut short: ModelParallelStrategy.teardown never
    # calls the CheckpointIO's teardown, which would wait for that)
    visible = sorted(n for n in os.listdir(tmp_path / "ck") if not n.startswith("."))
    assert visible == ["epoch=2-step=6.ckpt", "epoch=3-step=8.ckpt"]


def test_it_says_so_at_setup_even_when_nothing_is_ever_removed(tmp_path):
    said = two_ranks(tmp_path, "--stock", "--io", "--last")  # last.ckpt only: no removal reaches the plugin
    assert said[0].count("with PyTorch DCP, not through FastCheckpointIO") == 1, said[0][-3000:]
    assert "ModelParallelStrategy saves its distributed checkpoints itself" in said[0]
    assert "not through FastCheckpointIO" not in said[1]  # rank 0 says it


def test_a_save_that_failed_on_one_rank_is_raised_on_every_rank_at_a_later_save(tmp_path):
    """Rank 1's file of the second save (step 4) fails. The error is raised on both ranks at the
    first save (or the final wait) at which rank 0 sees that save ended: the next one, or, on a
    loaded machine, the failed save still in its last collective, a later one — by which time
    step 6, and even step 8, may be committed (each a whole checkpoint of its own) and
    ModelCheckpoint may have rotated step 2 out (a CI flake took [8, 6]). Either way the run stops
    on both ranks before it ends, the failed save is never taken as committed, and a committed
    checkpoint remains."""
    said = two_ranks(tmp_path, "--fail-second-save", ok=False)  # a hang would time out (300 s)
    for rank, out in enumerate(said):
        assert "injected: rank 1 cannot write its file of the second save" in out, f"rank {rank}: {out[-3000:]}"
        assert f"rank {rank} done" not in out  # the run stopped there, on both ranks
    steps = [info.step for info in committed(tmp_path / "ck")]
    assert steps and 4 not in steps and set(steps) <= {2, 6, 8}, steps  # step 4 never committed
    for step in steps:
        name = f"epoch={step // 2 - 1}-step={step}.ckpt"
        assert record.read(str(tmp_path / "ck" / name), RECORD, every_rank=False).step == step


def test_the_docs_lightning_calls_are_the_ones_this_test_makes():
    """The FastModelParallelStrategy block of docs/dcp.md runs as written (test_first_hour); its
    call of the strategy, with its keyword names, is one tests/workers/lit_mp_worker.py makes."""
    missing = readme_blocks.calls_not_in(os.path.join(ROOT, "docs", "dcp.md"), "Lightning's ModelParallelStrategy",
                                         "`FastModelParallelStrategy`", os.path.join(WORKERS, "lit_mp_worker.py"),
                                         ("FastModelParallelStrategy",))
    assert not missing, missing


def test_last_ckpt_saved_into_again_and_again_is_always_a_committed_checkpoint(uninterrupted, tmp_path):
    two_ranks(tmp_path / "run", "--last")
    ck = tmp_path / "run" / "ck"
    assert sorted(os.listdir(ck)) == ["last.ckpt"]  # no hidden sibling left behind
    assert record.read(str(ck / "last.ckpt"), RECORD, every_rank=False).step == STEPS
    said = two_ranks(tmp_path / "resumed", "--resume", ck / "last.ckpt")  # nothing left to train
    assert all(f"done {STEPS}" in s for s in said), said
    assert equal(torch.load(tmp_path / "resumed" / "final.pt", weights_only=True),
                 torch.load(uninterrupted / "final.pt", weights_only=True))


def test_a_swap_cut_short_by_a_crash_is_finished_by_the_next_load(uninterrupted, tmp_path):
    from fastckpt.dcp.saved_paths import NEW, OLD, recover
    kept = uninterrupted / "ck" / "epoch=3-step=8.ckpt"
    last = tmp_path / "last.ckpt"
    shutil.copytree(kept, tmp_path / f".last.ckpt{NEW}")  # renamed away, the new one not yet in place
    recover(last)
    assert record.read(str(last), RECORD, every_rank=False).step == STEPS and os.listdir(tmp_path) == ["last.ckpt"]
    shutil.rmtree(last)
    shutil.copytree(kept, tmp_path / f".last.ckpt{OLD}")  # the new one was never committed: the old returns
    os.makedirs(tmp_path / f".last.ckpt{NEW}")
    recover(last)
    assert record.read(str(last), RECORD, every_rank=False).step == STEPS and os.listdir(tmp_path) == ["last.ckpt"]
