"""DeepSpeed on one GPU over NCCL with the "fastckpt" entry: ZeRO-1, 2 (bf16) and 3 save on a real
CUDA engine and a fresh engine resumes bit for bit (the same next losses, parameters and
learning rate). Skipped without CUDA (run: make test-gpu)."""
from __future__ import annotations

import os

import pytest

from support.deepspeed_runs import assert_resumed_exactly, run

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("stage,dtype", [(1, "fp32"), (2, "bf16"), (3, "fp32")])
@pytest.mark.parametrize("strategy", ["c", "d"])
def test_zero_stages_on_one_gpu_resume_bit_exact(tmp_path, stage, dtype, strategy):
    entry = f'{{"concurrency": 2, "chunk_mb": 1, "strategy": "{strategy}", "stall_timeout_s": 60}}'
    cuda = dict(DS_ACCELERATOR="cuda", FASTCKPT_ENTRY=entry, CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0"))
    trained = run("train", tmp_path / "ck", tmp_path / "a.pt", "--stage", str(stage), "--dtype", dtype, **cuda)
    assert trained["engine"] == "FastckptEngine"
    assert next(iter(trained["params"].values())).is_cuda
    assert os.path.isfile(tmp_path / "ck" / "global_step3" / "COMMIT")
    resumed = run("resume", tmp_path / "ck", tmp_path / "b.pt", "--stage", str(stage), "--dtype", dtype, **cuda)
    assert_resumed_exactly(trained, resumed)
