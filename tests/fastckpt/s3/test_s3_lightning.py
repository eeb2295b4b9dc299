"""Lightning's ModelCheckpoint with a bucket's prefix as its dirpath (dirpath="s3://..."), through
FastCheckpointIO, on 2 DDP ranks (gloo) against a real S3 server: every checkpoint in the bucket
equals a synchronous torch.save of the same dict, and training resumes from the bucket bit-exact.
Lightning's own listing, its `exists`, `ls` and removal of old top-k files, go through fsspec
(s3fs); our upload and its record through fastckpt's path store. Lightning's `ckpt_path="last"`
finds nothing in a bucket (it drops the URL's scheme: Lightning-AI/pytorch-lightning#18261), so the
resume names last.ckpt's URL."""
from __future__ import annotations

import uuid

import pytest
import torch

from lightning_fastckpt import FastCheckpointIO
from support.lightning_runs import losses, run
from workers.lit_app import assert_equal

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def listed(url: str) -> list[str]:
    import fsspec
    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    return sorted(p.rsplit("/", 1)[1] for p in fs.ls(url))


def test_ddp_saves_to_a_bucket_and_resumes_from_it_bit_exact(s3_env, tmp_path):
    """save_top_k=1: each epoch's file replaces the one before (Lightning removes it through
    FastCheckpointIO: the object and its record)."""
    url = f"s3://{s3_env.bucket}/lit-{uuid.uuid4().hex[:8]}"
    run(tmp_path / "whole", "--epochs", "3", ddp=True)  # the uninterrupted run, on the local disk
    run(tmp_path / "s3", "--epochs", "2", "--ck", url, "--top-k", "1", ddp=True)
    names = listed(url)
    assert names == ["epoch=1-step=8.ckpt", "epoch=1-step=8.ckpt.fastckpt-commit", "last.ckpt",
                     "last.ckpt.fastckpt-commit"], names
    io = FastCheckpointIO()
    for name in ("epoch=1-step=8.ckpt", "last.ckpt"):
        got = io.load_checkpoint(f"{url}/{name}")  # checked against its commit record
        want = torch.load(tmp_path / "s3" / "sync" / f"step-{got['global_step']}.pt", weights_only=True)
        assert_equal({"state_dict": got["state_dict"], "optimizer_states": got["optimizer_states"]}, want)
    io.teardown()
    run(tmp_path / "s3", "--epochs", "3", "--ck", url, "--top-k", "1", "--resume-from", f"{url}/last.ckpt", ddp=True)
    a, b = (torch.load(tmp_path / "s3" / f"loaded-rank{r}.pt", weights_only=True) for r in range(2))
    assert a["global_step"] == b["global_step"] == 8
    whole, resumed = losses(tmp_path / "whole"), losses(tmp_path / "s3")
    assert resumed == whole and len(whole) == 12  # every loss after the resume as in the uninterrupted run
    assert_equal(torch.load(tmp_path / "s3" / "final-rank0.pt"), torch.load(tmp_path / "whole" / "final-rank0.pt"))
    assert listed(url) == ["epoch=2-step=12.ckpt", "epoch=2-step=12.ckpt.fastckpt-commit", "last.ckpt",
                           "last.ckpt.fastckpt-commit"]
