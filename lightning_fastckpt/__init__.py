"""fastckpt for PyTorch Lightning and Fabric.

    from lightning_fastckpt import FastCheckpointIO
    trainer = Trainer(plugins=[FastCheckpointIO(strategy="c", concurrency=2)])

`LayerwiseCheckpointing` (a callback) adds LightCheck's layer-wise snapshot, pipelined
with DDP's gradient all-reduce. `TensorOffload` (a callback) offloads the training step's
saved activations to SSD (Fastensor). `TunedModelCheckpoint(every_n_train_steps="auto",
overhead=0.05)` chooses the interval and FastCheckpointIO's concurrency/writers by PCcheck's
tuner, measured on this machine.
"""
from .checkpoint_io import FastCheckpointIO
from .layerwise import LayerwiseCheckpointing
from .offload import TensorOffload
from .tuned_checkpoint import TunedModelCheckpoint

__all__ = ["FastCheckpointIO", "LayerwiseCheckpointing", "TensorOffload", "TunedModelCheckpoint"]
