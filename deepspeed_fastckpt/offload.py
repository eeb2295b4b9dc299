"""Activation offload (Fastensor) for a DeepSpeed engine.

    engine, *_ = deepspeed.initialize(..., config={..., "fastckpt": {"offload": {"threshold_mb": 1}}})
    # or, on any engine:
    deepspeed_fastckpt.offload_activations(engine, directory="/ssd/tmp", threshold_mb=1)

Owns the placement of fastckpt.offload.ActivationOffload in DeepSpeed's training loop
(`loss = engine(x); engine.backward(loss); engine.step()`): the saved-tensor hooks are
entered for the engine's forward when gradients are on, the micro-batch's files are
removed once its backward has used every offloaded activation, and anything left
(graph parts backward never reached) is removed at step() and destroy(); a forward or
backward that raises removes its files too. The settings are OffloadConfig's.
"""
from __future__ import annotations

import functools
from typing import Any, Optional

import torch

from fastckpt.offload import ActivationOffload
from fastckpt.offload.settings import OffloadConfig

ATTR = "_fastckpt_offload"


def offload_activations(engine, directory: Optional[str] = None, **settings: Any) -> ActivationOffload:
    """Offloads the engine's saved activations from now on; returns the ActivationOffload."""
    node = dict(settings, directory=directory, enabled=True)
    return attach(engine, node)


def attach(engine, node: Any) -> Optional[ActivationOffload]:
    """Attaches the offload a settings node asks for (None/False/enabled=false: none)."""
    off = OffloadConfig.from_node(node).build()
    previous = engine.__dict__.get(ATTR)
    if previous is not None:
        previous.close()
    engine.__dict__[ATTR] = off
    return off


def offload_of(engine) -> Optional[ActivationOffload]:
    return engine.__dict__.get(ATTR)


def wrap_forward(original):
    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        off = offload_of(self)
        if off is None or not torch.is_grad_enabled():
            return original(self, *args, **kwargs)
        off.start()
        try:
            with off.hooks():
                return original(self, *args, **kwargs)
        except BaseException:
            off.close()
            raise

    return forward


def wrap_backward(original):
    @functools.wraps(original)
    def backward(self, *args, **kwargs):
        off = offload_of(self)
        try:
            out = original(self, *args, **kwargs)
        except BaseException:
            if off is not None:
                off.close()
            raise
        if off is not None and off.finished:
            off.close()
        return out

    return backward


def wrap_closing(original):
    """step() and destroy(): whatever this step offloaded and backward never used is removed."""
    @functools.wraps(original)
    def closing(self, *args, **kwargs):
        off = offload_of(self)
        if off is not None:
            off.close()
        return original(self, *args, **kwargs)

    return closing
