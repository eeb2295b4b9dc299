"""Lightning with strategy='ddp' on 2 CPU processes (gloo), layer-wise snapshots, and kill -9 resume.

The ranks are real processes started like torchrun does (LOCAL_RANK, WORLD_SIZE, ...),
so Lightning joins them instead of spawning. Resume tests kill every training process
with SIGKILL after a checkpoint was committed and require the resumed run to repeat
the uninterrupted one bit for bit: every later loss and the final weights.
"""
from __future__ import annotations

import glob
import json
import os
import signal
import sys
import time

import pytest
import torch

from support import warm
from fastckpt import load as fastckpt_load
from support.lightning_runs import launch, losses, run
from workers.lit_app import assert_equal

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.mark.parametrize("layerwise", [False, True], ids=["async", "layerwise"])
def test_ddp_rank0_saves_every_rank_loads(tmp_path, layerwise):
    """Every checkpoint equals a synchronous torch.save of the same dict, bit for bit; both ranks resume."""
    flags = ["--epochs", "3", "--big", "1024", "--staging-mb", "4"] + (["--layerwise"] if layerwise else [])
    run(tmp_path, *flags, ddp=True)
    ckpts = sorted(glob.glob(str(tmp_path / "ck" / "epoch=*.ckpt")))
    assert len(ckpts) == 3
    stats = json.load(open(tmp_path / "stats-rank0.json"))
    if layerwise:  # the copies were started bucket by bucket by the DDP comm hook
        assert stats["layerwise_released"] > 0, stats
    for path in ckpts:
        got = torch.load(path, weights_only=True)
        want = torch.load(tmp_path / "sync" / f"step-{got['global_step']}.pt", weights_only=True)
        assert_equal({"state_dict": got["state_dict"], "optimizer_states": got["optimizer_states"]}, want)
    run(tmp_path, *flags, "--resume", "--epochs", "4", ddp=True)
    a, b = (torch.load(tmp_path / f"loaded-rank{r}.pt", weights_only=True) for r in range(2))
    assert a["global_step"] == b["global_step"] > 0
    assert_equal(a["state_dict"], b["state_dict"])
    finals = [torch.load(tmp_path / f"final-rank{r}.pt") for r in range(2)]
    params = [{k: v for k, v in f.items() if "running" not in k and "num_batches" not in k} for f in finals]
    assert_equal(params[0], params[1])  # BatchNorm statistics are per rank after the last forward


def test_ddp_every_rank_saves_one_file_per_rank(tmp_path):
    run(tmp_path, "--epochs", "2", "--per-rank", ddp=True)
    last = tmp_path / "ck" / "last.ckpt"
    assert last.is_dir() and (last / "COMMIT").exists()
    names = sorted(os.listdir(last))
    assert [n.split(".")[0] for n in names if n.startswith("rank-")] == ["rank-0", "rank-1"]
    assert warm.run([sys.executable, "-m", "fastckpt.tools.cli", "verify", str(last)],
                    capture_output=True).returncode == 0
    run(tmp_path, "--epochs", "3", "--per-rank", "--resume", ddp=True)
    a, b = (torch.load(tmp_path / f"loaded-rank{r}.pt", weights_only=True) for r in range(2))
    assert a["global_step"] == b["global_step"] > 0


def kill_after_checkpoint(out, procs, min_epoch: int, timeout=240) -> None:
    """SIGKILL every process once epoch >= min_epoch is committed and a later step has run."""
    deadline = time.time() + timeout
    ck = os.path.join(out, "ck")
    while time.time() < deadline:
        done = [int(os.path.basename(p).split("-")[0].split("=")[1]) for p in glob.glob(os.path.join(ck, "epoch=*.ckpt"))]
        if done and max(done) >= min_epoch and os.path.exists(os.path.join(out, "loss-rank0.txt")):
            n_after = len(losses(out))
            time.sleep(0.3)
            if len(losses(out)) > n_after:  # training went on past the checkpoint
                break
        if any(p.poll() is not None for p in procs):
            raise AssertionError("a worker ended before it could be killed")
        time.sleep(0.05)
    for p in procs:
        p.send_signal(signal.SIGKILL)
    for p in procs:
        p.wait()
    assert all(p.returncode == -signal.SIGKILL for p in procs)


@pytest.mark.parametrize("ddp", [False, True], ids=["single", "ddp"])
def test_kill9_then_resume_is_bit_exact(tmp_path, ddp):
    ref, crash = tmp_path / "ref", tmp_path / "crash"
    run(ref, "--epochs", "5", ddp=ddp)
    procs = launch(crash, "--epochs", "5", "--sleep", "0.1", ddp=ddp)
    kill_after_checkpoint(str(crash), procs, min_epoch=1)
    killed_at = max(losses(crash))
    run(crash, "--epochs", "5", "--resume", ddp=ddp)
    resumed_from = torch.load(crash / "loaded-rank0.pt", weights_only=True)["global_step"]
    assert 0 < resumed_from < killed_at, (resumed_from, killed_at)
    want, got = losses(ref), losses(crash)
    assert sorted(got) == sorted(want)
    later = [s for s in want if s > resumed_from]
    assert later and all(got[s] == want[s] for s in later), "a loss after the resume differs"
    for r in range(2 if ddp else 1):
        assert_equal(torch.load(crash / f"final-rank{r}.pt"), torch.load(ref / f"final-rank{r}.pt"))


def test_a_save_that_failed_on_rank_0_is_raised_on_every_rank_at_the_next_save(tmp_path, fault_shim):
    """Rank 0 alone saves (DDP); its save of epoch 1 fails as it is written (the fault shim: EIO).
    At the next Trainer.save_checkpoint every rank raises — rank 0 its error, rank 1 that the rank
    that saves failed — instead of rank 0 alone while rank 1 waits in the save's barrier until the
    process group times out. Both end within a minute; the checkpoints before stay."""
    procs = launch(tmp_path, "--epochs", "4", ddp=True, LD_PRELOAD=fault_shim, FASTCKPT_FAULT_PATH=".epoch=1-step=")
    t = time.monotonic()
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(max(1.0, 90 - (time.monotonic() - t))))
        except Exception:  # noqa: BLE001 - a rank left waiting: the failure this test is about
            for q in procs:
                q.kill()
            raise AssertionError("a rank still runs 90 s on:\n" + "\n---\n".join(
                open(tmp_path / f"log-{r}.txt").read()[-2000:] for r in (0, 1)))
    logs = [open(tmp_path / f"log-{r}.txt").read() for r in (0, 1)]
    assert codes[0] != 0 and codes[1] != 0, (codes, logs[0][-2000:], logs[1][-2000:])
    assert "Input/output error" in logs[0], logs[0][-3000:]
    assert "failed on the rank that saves" in logs[1], logs[1][-3000:]
    assert fastckpt_load(tmp_path / "ck" / "epoch=0-step=4.ckpt")["global_step"] == 4
