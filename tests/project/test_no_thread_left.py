"""Nothing fastckpt starts outlives what started it: every thread of a Checkpointer, a save, an
offload, a Lightning plugin or a DeepSpeed engine has ended once the Checkpointer is closed,
the Trainer torn down or the engine destroyed — Python threads (any new one: Lightning's own
suite fails a test on a thread left running) and the native engine's (named fastckpt-*).
Checked at once, with no grace: a thread that is merely ending must have been joined."""
from __future__ import annotations

import json

import pytest
import torch

import fastckpt
from fastckpt.offload import ActivationOffload, TensorIO
from workers.threads_left import threads_left, threads_now


def test_no_thread_outlives_a_closed_checkpointer_a_save_or_an_offload(tmp_path):
    before = threads_now()
    state = {"w": torch.randn(512, 512), "b": torch.randn(512)}
    ck = fastckpt.Checkpointer(str(tmp_path / "ck"), concurrency=2, keep=2)
    ck.reserve(8 << 20)  # staging grown in the background
    for step in range(4):
        ck.save(state, step=step)
        ck.gate()
    ck.close()
    assert threads_left(before) == []
    fastckpt.save(state, tmp_path / "one.pt")
    fastckpt.save(state, tmp_path / "two.pt", progress=lambda done, total: None)
    assert torch.equal(fastckpt.load(tmp_path / "one.pt")["w"], state["w"])
    io = TensorIO(mode="aware")
    with ActivationOffload(str(tmp_path / "act"), threshold_mb=0.1, io=io):
        torch.nn.Linear(512, 512)(torch.randn(256, 512)).relu().sum().backward()
    assert threads_left(before) == []
    with fastckpt.Checkpointer(str(tmp_path / "ck")) as again:
        again.load()
    assert threads_left(before) == []


def test_no_thread_outlives_a_torn_down_trainer_or_a_save_after_fit(tmp_path):
    """fit with saves every step, removals of older ones and activation offload; then
    trainer.save_checkpoint after fit (no teardown follows it: Lightning's
    test_hpc_restore_attempt found its staging grower still running); then a second Trainer
    that resumes from it, whose steps the first plugin's gate also sees; then a plugin that
    loads outside fit and is never torn down (Lightning's test_preloaded_checkpoint_lifecycle),
    while a third Trainer trains."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightning_fastckpt import FastCheckpointIO, TensorOffload
    from workers.lit_app import TinyModule, loader, trainer

    before = threads_now()
    torch.manual_seed(0)
    model = TinyModule(width=256)
    cbs = [ModelCheckpoint(dirpath=tmp_path / "ck", every_n_train_steps=1, save_top_k=2, monitor="loss"),
           TensorOffload(str(tmp_path / "act"), threshold_mb=0.001)]
    first = trainer(FastCheckpointIO(concurrency=2), cbs, max_steps=6)
    first.fit(model, loader())
    assert threads_left(before) == []
    first.save_checkpoint(tmp_path / "after-fit.ckpt")  # outside any run
    assert threads_left(before) == []
    second = trainer(FastCheckpointIO(), [], max_steps=10)
    second.fit(model, loader(), ckpt_path=tmp_path / "after-fit.ckpt")
    assert second.global_step == 10
    assert threads_left(before) == []
    stale = trainer(FastCheckpointIO(), [], max_steps=1)
    stale.strategy.load_checkpoint(tmp_path / "after-fit.ckpt")  # no teardown ever follows
    trainer(FastCheckpointIO(), [], max_steps=4).fit(TinyModule(width=256), loader())
    assert threads_left(before) == []


@pytest.mark.parametrize("stage", [1, 3])
def test_no_thread_outlives_a_destroyed_deepspeed_engine(tmp_path, stage):
    pytest.importorskip("deepspeed")
    from support.deepspeed_runs import run
    entry = json.dumps({"concurrency": 2, "chunk_mb": 1, "offload": {"directory": str(tmp_path / "act"),
                                                                    "threshold_mb": 0.001}})
    (tmp_path / "act").mkdir()
    got = run("threads", tmp_path / "ck", tmp_path / "o.pt", "--stage", str(stage), FASTCKPT_ENTRY=entry)
    assert got["threads_left"] == []
