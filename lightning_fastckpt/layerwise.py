"""LayerwiseCheckpointing: LightCheck's layer-wise snapshot, pipelined with DDP's gradient all-reduce.

Owns wiring fastckpt.write.layerwise into a Lightning run. With it, a save
issued at the end of step i copies nothing at once (only tensors outside the
optimizer, which save copies itself). During step i+1's backward, when DDP hands
a gradient bucket to its communication hook, the copy of that bucket's parameters
and their optimizer state starts, overlapping the bucket's all-reduce and the rest
of the backward pass. On CPU (gloo) the bucket's future completes only once its
copy is done too; on CUDA NCCL completes a bucket's future at enqueue and runs its
callbacks inline on the backward thread, so the future is not delayed and the copy
runs on the side stream (not yet run on a GPU). Either way the optimizer step is
one update of every parameter, so it waits at the gate for every bucket's copy:
what layer-wise wins is the copies' overlap with backward and the all-reduce, not
an update that waits for one bucket alone. Whatever no bucket covered is released
by the gate before the optimizer step.

Composition: the hook wraps the comm hook given to `DDPStrategy(ddp_comm_hook=...)`
(default: all-reduce), and Lightning's `ddp_comm_wrapper` wraps ours. A hook
registered on the DDP module some other way cannot be composed: setup raises.
Without DDP (one process) the copy of each parameter starts when its gradient is
accumulated, overlapping the rest of the backward pass.
"""
from __future__ import annotations

from typing import Optional, cast

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.hooks import RemovableHandle

from fastckpt.session import layerwise_comm_hook

from .checkpoint_io import FastCheckpointIO


class LayerwiseCheckpointing(Callback):
    """Add to `Trainer(callbacks=[...])` next to `plugins=[FastCheckpointIO(...)]`."""

    def __init__(self) -> None:
        self._io: Optional[FastCheckpointIO] = None
        self._grad_hooks: list[RemovableHandle] = []

    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        io = trainer.strategy.checkpoint_io
        if not isinstance(io, FastCheckpointIO):
            raise TypeError("LayerwiseCheckpointing needs Trainer(plugins=[FastCheckpointIO(...)]); "
                            f"the checkpoint IO here is {type(io).__name__}")
        io.layerwise = True
        self._io = io
        strategy = trainer.strategy
        if (isinstance(strategy, DDPStrategy) and strategy.root_device.type == "cuda"
                and not getattr(strategy._ddp_comm_hook, "fastckpt_layerwise", False)):
            # Lightning registers strategy._ddp_comm_hook itself on CUDA: compose before it does
            # (once: setup runs again for validate/test on the same strategy).
            strategy._ddp_comm_hook = layerwise_comm_hook(io.saves.held, strategy._ddp_comm_hook)

    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        strategy = trainer.strategy
        model = strategy.model
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            ddp = cast(DDPStrategy, strategy)  # the strategy that wrapped the model in DDP
            if ddp.root_device.type != "cuda":  # Lightning registers no comm hook on CPU
                assert self._io is not None  # set by setup(), which Lightning runs before on_fit_start
                hook = layerwise_comm_hook(self._io.saves.held, ddp._ddp_comm_hook)
                try:
                    model.register_comm_hook(ddp._ddp_comm_state, hook)
                except RuntimeError as e:
                    raise RuntimeError(
                        "LayerwiseCheckpointing cannot install its DDP communication hook: a hook is "
                        "already registered on this DDP module. Pass yours as "
                        "DDPStrategy(ddp_comm_hook=...) so the two can be composed.") from e
        else:
            for p in pl_module.parameters():
                if p.requires_grad:
                    self._grad_hooks.append(p.register_post_accumulate_grad_hook(self._on_grad))

    def _on_grad(self, param: torch.Tensor) -> None:
        assert self._io is not None  # set by setup(), before on_fit_start registered this hook
        self._io.saves.held.release_params([param])

    def teardown(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        for h in self._grad_hooks:
            h.remove()
        self._grad_hooks.clear()
