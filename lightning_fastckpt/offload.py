"""TensorOffload: Fastensor's activation offload for `Trainer(callbacks=[TensorOffload(...)])`.

Owns the placement of fastckpt.offload.ActivationOffload in Lightning's training step: its
hooks are entered when a training batch starts (the forward of training_step saves its
activations through them) and left before backward; the step's files are removed when the
batch ends, and also when it raised. The learned I/O dictionaries are saved at the end of
training when `learned_path` is set.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import Tensor
from torch.autograd.graph import saved_tensors_hooks
from typing_extensions import override

from fastckpt.session import ActivationOffload, OffloadConfig


class TensorOffload(Callback):
    """TensorOffload(directory, threshold_mb=1.0, mode="aware", aware="w", tool=None, dict_path=None,
    learned_path=None, refresh_every=None, max_inflight_mb=256, prefetch=2, writers=2): the settings
    of fastckpt.offload.settings.OffloadConfig (unknown ones are a ConfigError).
    TensorOffload.from_config(cfg.offload) takes the Hydra group's node."""

    def __init__(self, directory: Optional[str] = None, **settings: Any) -> None:
        self.offload: ActivationOffload = OffloadConfig.from_node(dict(settings, directory=directory)).offload()
        self.io = self.offload.io
        self._hooks: Optional[saved_tensors_hooks] = None

    @classmethod
    def from_config(cls, node: Any) -> Optional["TensorOffload"]:
        """The callback for a Hydra `offload` node, or None when that node says off."""
        cfg = OffloadConfig.from_node(node)
        if not cfg.enabled:
            return None
        settings = dataclasses.asdict(cfg)
        settings.pop("enabled")
        return cls(**settings)

    def _leave_hooks(self) -> None:
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            hooks.__exit__(None, None, None)

    @override
    def on_train_batch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any,
                             batch_idx: int) -> None:
        self.offload.start()
        self._hooks = self.offload.hooks()
        self._hooks.__enter__()

    @override
    def on_before_backward(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", loss: Tensor) -> None:
        self._leave_hooks()

    @override
    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: STEP_OUTPUT,
                           batch: Any, batch_idx: int) -> None:
        self._leave_hooks()
        self.offload.close()

    @override
    def on_exception(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", exception: BaseException) -> None:
        self._leave_hooks()
        self.offload.close()

    @override
    def on_train_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.io.learned_path:
            self.io.save_dictionaries()
