"""fastckpt for PyTorch Lightning and Fabric.

    from lightning_fastckpt import FastCheckpointIO
    trainer = Trainer(plugins=[FastCheckpointIO(strategy="c", concurrency=2)])

`LayerwiseCheckpointing` (a callback) adds LightCheck's layer-wise snapshot, pipelined
with DDP's gradient all-reduce. `TensorOffload` (a callback) offloads the training step's
saved activations to SSD (Fastensor). `TunedModelCheckpoint(every_n_train_steps="auto",
overhead=0.05)` chooses the interval and FastCheckpointIO's concurrency/writers by PCcheck's
tuner, measured on this machine. `FastModelParallelStrategy` is Lightning's ModelParallelStrategy
(FSDP2, tensor parallelism) saving its distributed checkpoints through fastckpt.dcp.
`PreemptCheckpoint` (a callback) checkpoints the step every rank agrees on when SIGTERM comes,
and exits.

The names load on first use (PEP 562): importing the package itself imports no Lightning.
Through the entry-point group `lightning.pytorch.callbacks_factory` (callbacks() below),
Lightning adds lightning_fastckpt.watch's callback to a Trainer made while a FastCheckpointIO
exists or after the DeepSpeed plugin was imported, and to no other.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning.pytorch.callbacks import Callback

__all__ = ["FastCheckpointIO", "FastModelParallelStrategy", "LayerwiseCheckpointing", "PreemptCheckpoint",
           "TensorOffload", "TunedModelCheckpoint"]


def __getattr__(name: str) -> Any:
    value: Any
    if name == "FastCheckpointIO":
        from .checkpoint_io import FastCheckpointIO
        value = FastCheckpointIO
    elif name == "FastModelParallelStrategy":
        from .model_parallel import FastModelParallelStrategy
        value = FastModelParallelStrategy
    elif name == "LayerwiseCheckpointing":
        from .layerwise import LayerwiseCheckpointing
        value = LayerwiseCheckpointing
    elif name == "PreemptCheckpoint":
        from .preempt import PreemptCheckpoint
        value = PreemptCheckpoint
    elif name == "TensorOffload":
        from .offload import TensorOffload
        value = TensorOffload
    elif name == "TunedModelCheckpoint":
        from .tuned_checkpoint import TunedModelCheckpoint
        value = TunedModelCheckpoint
    else:
        raise AttributeError(f"module 'lightning_fastckpt' has no attribute {name!r}")
    globals()[name] = value
    return value


def callbacks() -> list[Callback]:
    """Lightning's `lightning.pytorch.callbacks_factory` entry point, called once per Trainer with
    nothing that says which Trainer: lightning_fastckpt.watch's callback while a FastCheckpointIO
    exists in this process or the DeepSpeed plugin was imported (what the callback serves), else
    nothing — a Trainer of a process that uses neither gets no callback and no log line."""
    from fastckpt.session import front_ends

    from .checkpoint_io import MADE
    if not (len(MADE) or front_ends.is_started("deepspeed")):
        return []
    from .watch import FastckptWatch
    return [FastckptWatch()]


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
