"""fastckpt for PyTorch Lightning and Fabric.

    from lightning_fastckpt import FastCheckpointIO
    trainer = Trainer(plugins=[FastCheckpointIO(strategy="c", concurrency=2)])

`LayerwiseCheckpointing` (a callback) adds LightCheck's layer-wise snapshot, pipelined
with DDP's gradient all-reduce.
"""
from .checkpoint_io import FastCheckpointIO
from .layerwise import LayerwiseCheckpointing

__all__ = ["FastCheckpointIO", "LayerwiseCheckpointing"]
