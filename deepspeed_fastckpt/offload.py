"""Activation offload (Fastensor) for a DeepSpeed engine.

    engine, *_ = deepspeed.initialize(..., config={..., "fastckpt": {"offload": {"threshold_mb": 1}}})
    # or, on any engine:
    deepspeed_fastckpt.offload_activations(engine, directory="/ssd/tmp", threshold_mb=1)

Owns which ActivationOffload an engine has. Its placement in DeepSpeed's training loop
(`loss = engine(x); engine.backward(loss); engine.step()`) goes through the engine's own
module hooks (deepspeed_fastckpt.engine_hooks): the saved-tensor hooks are entered for the
engine's forward when gradients are on; the micro-batch's files are removed once its backward
has used every offloaded activation (close_when_used); anything left (graph parts backward
never reached) is removed when the next step's first forward begins, and at destroy(); a
forward that raises removes its files at once. The settings are OffloadConfig's.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from fastckpt.session import ActivationOffload, activation_offload

from .engine_hooks import hooks_of, peek

if TYPE_CHECKING:
    from deepspeed.runtime.engine import DeepSpeedEngine


def offload_activations(engine: DeepSpeedEngine, directory: Optional[str] = None,
                        **settings: Any) -> ActivationOffload:
    """Offloads the engine's saved activations from now on; returns the ActivationOffload."""
    node = dict(settings, directory=directory, enabled=True)
    off = attach(engine, node)
    assert off is not None  # enabled=True: attach made one
    return off


def attach(engine: DeepSpeedEngine, node: Any) -> Optional[ActivationOffload]:
    """Attaches the offload a settings node asks for (None/False/enabled=false: none)."""
    off = activation_offload(node)
    if off is not None:
        off.close_when_used = True
    hooks = hooks_of(engine)
    if hooks.offload is not None:
        hooks.offload.close()
    hooks.offload = off
    return off


def offload_of(engine: DeepSpeedEngine) -> Optional[ActivationOffload]:
    hooks = peek(engine)
    return None if hooks is None else hooks.offload


def close(engine: DeepSpeedEngine) -> None:
    """Whatever the engine's offload still holds is removed (destroy())."""
    off = offload_of(engine)
    if off is not None:
        off.close()
