"""Lightning on one GPU with FastCheckpointIO: strategies c, g, d and layer-wise (DDP over NCCL with
one process, which still hands every gradient bucket to the communication hook), bf16-mixed.

Each run checkpoints every epoch; every checkpoint must equal a synchronous torch.save of the
same dict (so no update raced a snapshot), and a run resumed from an earlier checkpoint must
repeat the uninterrupted run bit for bit: every later loss and the final weights.
Skipped without CUDA (run: make test-gpu).
"""
from __future__ import annotations

import glob
import json
import os

import pytest
import torch

from workers.lit_app import assert_equal
from support.lightning_runs import losses, run

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::UserWarning")]
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS for bit-exact resumes


@pytest.mark.parametrize("mode", ["c", "g", "d", "layerwise"])
def test_gpu_checkpoints_match_and_resume_bit_exact(tmp_path, mode):
    flags = ["--gpu", "--precision", "bf16-mixed", "--big", "2048",
             "--io-strategy", "c" if mode == "layerwise" else mode]
    if mode == "layerwise":
        flags += ["--ddp", "--layerwise"]
    ref, resumed = tmp_path / "ref", tmp_path / "resumed"
    run(ref, *flags, "--epochs", "4", ddp=False, timeout=300)
    for path in sorted(glob.glob(str(ref / "ck" / "epoch=*.ckpt"))):
        got = torch.load(path, weights_only=True, map_location="cuda")
        want = torch.load(ref / "sync" / f"step-{got['global_step']}.pt", weights_only=True, map_location="cuda")
        assert_equal({"state_dict": got["state_dict"], "optimizer_states": got["optimizer_states"]}, want)
    if mode == "layerwise":
        stats = json.load(open(ref / "stats-rank0.json"))
        assert stats["layerwise_released"] > 0, stats  # the comm hook started the copies
    run(resumed, *flags, "--epochs", "2", ddp=False, timeout=300)
    run(resumed, *flags, "--epochs", "4", "--resume", ddp=False, timeout=300)
    start = torch.load(resumed / "loaded-rank0.pt", weights_only=True)["global_step"]
    want, got = losses(ref), losses(resumed)
    later = [s for s in want if s > start]
    assert start > 0 and later and all(got[s] == want[s] for s in later), "a loss after the resume differs"
    assert_equal(torch.load(resumed / "final-rank0.pt"), torch.load(ref / "final-rank0.pt"))
