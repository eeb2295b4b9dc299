"""Tensors written in place right after save_checkpoint returns never corrupt a checkpoint.

The gate orders only the optimizer update after the background copy. These runs write the
saved tensors in place by other means right after the save: ModelCheckpoint under manual
optimization (it swaps the pre-step weights in for the save and restores the current ones at
once), and a callback that writes every parameter and every optimizer state tensor in place
after each save. Every checkpoint must equal a synchronous torch.save of the dict Lightning
built; a snapshot whose tensors were written while it still copied must never land.
"""
from __future__ import annotations

import glob
import os

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from lightning_fastckpt import FastCheckpointIO
from workers.lit_app import TinyModule, assert_equal, loader, trainer

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:lightning")


class ManualOpt(L.LightningModule):
    """Manual optimization with a 64 MiB layer; keeps each step's weights from before its update
    where ModelCheckpoint looks for them (`saved_models`, `layer`)."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.layer = torch.nn.Linear(4096, 4096)
        self.saved_models = {}

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).square().mean()
        self.saved_models[batch_idx] = {k: v.detach().clone() for k, v in self.layer.state_dict().items()}
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def test_manual_optimization_checkpoints_hold_the_pre_step_weights(tmp_path):
    torch.manual_seed(0)
    model = ManualOpt()
    data = DataLoader(TensorDataset(torch.randn(4, 4096)), batch_size=1)
    cb = ModelCheckpoint(dirpath=str(tmp_path), every_n_train_steps=1, save_top_k=-1, save_weights_only=True)
    t = trainer(FastCheckpointIO(), [cb], max_epochs=1)
    t.fit(model, data)
    paths = sorted(glob.glob(str(tmp_path / "*.ckpt")))
    assert len(paths) == 4
    for path in paths:
        got = torch.load(path, weights_only=True)
        want = model.saved_models[got["global_step"] - 1]  # the weights from before that step's update
        assert torch.equal(got["state_dict"]["layer.weight"], want["weight"]), path
        assert torch.equal(got["state_dict"]["layer.bias"], want["bias"]), path


class WriteEverythingAfterSave(L.Callback):
    """Keeps a synchronous torch.save of each checkpoint dict as Lightning built it; once the save
    has returned (the next batch starts before any optimizer step), writes every parameter and
    optimizer tensor in place. at_saves: the saves after which it writes (None: all)."""

    def __init__(self, out, at_saves=None):
        self.out, self.at_saves, self.saves, self.armed = out, at_saves, 0, False

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        torch.save({"state_dict": checkpoint["state_dict"], "optimizer_states": checkpoint["optimizer_states"]},
                   os.path.join(self.out, f"sync-{checkpoint['global_step']}.pt"))
        self.saves += 1
        self.armed = self.at_saves is None or self.saves in self.at_saves

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if not self.armed:
            return
        self.armed = False
        with torch.no_grad():
            for p in pl_module.parameters():
                p.mul_(0.5)
            for state in trainer.optimizers[0].state.values():
                for v in state.values():
                    if isinstance(v, torch.Tensor) and v.is_floating_point():
                        v.add_(1.0)


def _fit(tmp_path, at_saves, **io):
    (tmp_path / "sync").mkdir()
    torch.manual_seed(0)
    cb = ModelCheckpoint(dirpath=str(tmp_path / "ck"), every_n_train_steps=2, save_top_k=-1)
    t = trainer(FastCheckpointIO(**io), [cb, WriteEverythingAfterSave(str(tmp_path / "sync"), at_saves)],
                max_steps=12)
    t.fit(TinyModule(big=1024), loader())
    return sorted(glob.glob(str(tmp_path / "ck" / "*.ckpt")))


def _assert_each_equals_its_sync_copy(tmp_path, paths):
    for path in paths:
        got = torch.load(path, weights_only=True)
        want = torch.load(tmp_path / "sync" / f"sync-{got['global_step']}.pt", weights_only=True)
        assert_equal({"state_dict": got["state_dict"], "optimizer_states": got["optimizer_states"]}, want, path)


def test_every_tensor_written_in_place_right_after_each_save(tmp_path):
    paths = _fit(tmp_path, at_saves=None)
    assert len(paths) == 6
    _assert_each_equals_its_sync_copy(tmp_path, paths)


def test_a_write_after_trust_was_earned_drops_that_snapshot_and_never_lands_it(tmp_path):
    """Two saves show that only the optimizer writes the tensors, so the third is copied after
    save returns — here held until the next step's gate (layer-wise mode), so that the copy
    surely comes after the write; a callback writes them in place first: that checkpoint must
    not land (a warning says why), and every later one is copied before save returns, and right."""
    with pytest.warns(UserWarning, match="written in place after save"):
        paths = _fit(tmp_path, at_saves={3}, layerwise=True)
    steps = [torch.load(p, weights_only=True)["global_step"] for p in paths]
    assert 6 not in steps and steps == [2, 4, 8, 10, 12], steps
    _assert_each_equals_its_sync_copy(tmp_path, paths)
