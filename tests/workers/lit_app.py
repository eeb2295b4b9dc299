"""A small deterministic Lightning module and data used by the Lightning tests and their workers.

`BigLinear` makes a checkpoint take longer to copy than a training step, so an update
racing an unfinished snapshot would show in the saved values. BatchNorm adds buffers
the forward pass changes. Data order is fixed (no shuffle) so runs repeat bit for bit.
"""
from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset


class TinyModule(L.LightningModule):
    def __init__(self, width: int = 64, big: int = 0, lr: float = 1e-2):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.BatchNorm1d(width),
                                       torch.nn.ReLU(), torch.nn.Linear(width, 1))
        # a wide layer: many bytes to snapshot, cheap to run
        self.big = torch.nn.Linear(big, big, bias=False) if big else None

    def forward(self, x):
        out = self.net(x)
        if self.big is not None:
            out = out + self.big(x.new_ones(1, self.big.in_features)).mean() * 1e-3  # dense gradient
        return out

    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("loss", loss, on_step=True, prog_bar=False)
        return loss

    def validation_step(self, batch, i):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y))

    def test_step(self, batch, i):
        x, y = batch
        self.log("test_loss", torch.nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=7)}


def loader(n: int = 128, batch: int = 16, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    ds = TensorDataset(torch.randn(n, 16, generator=g), torch.randn(n, 1, generator=g))
    return DataLoader(ds, batch_size=batch, shuffle=False)


def trainer(io=None, callbacks=(), **kw) -> L.Trainer:
    args = dict(logger=False, enable_progress_bar=False, enable_model_summary=False,
                accelerator="cpu", devices=1, deterministic=True, num_sanity_val_steps=0)
    args.update(kw)
    # no ModelCheckpoint given: no default one writing into the working directory
    args.setdefault("enable_checkpointing", any(isinstance(c, ModelCheckpoint) for c in callbacks))
    return L.Trainer(plugins=[io] if io is not None else None, callbacks=list(callbacks), **args)


def assert_equal(a, b, where: str = "checkpoint") -> None:
    """Exact equality of two loaded checkpoints: every key, every tensor bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), f"{where}: values differ"
        return
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a.keys()) == list(b.keys()), f"{where}: keys {a.keys()} != {b.keys()}"
        for k in a:
            assert_equal(a[k], b[k], f"{where}[{k!r}]")
        return
    if isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_equal(x, y, f"{where}[{i}]")
        return
    assert a == b, f"{where}: {a!r} != {b!r}"
