"""fastckpt for DeepSpeed: a `"fastckpt": {...}` entry in the DeepSpeed config selects
FastckptEngine (asynchronous, crash-safe checkpoints) once this package is imported.

    import deepspeed_fastckpt  # noqa: F401  (registers the engine with DeepSpeed)
    engine, *_ = deepspeed.initialize(model=model, config={..., "fastckpt": {"concurrency": 2}})
    # activation offload to SSD: "fastckpt": {"offload": {"threshold_mb": 1}} or
    deepspeed_fastckpt.offload_activations(engine, directory="/ssd/tmp", threshold_mb=1)
    # a checkpoint on SIGTERM: "fastckpt": {"preempt_signal": "SIGTERM"}, and after every engine.step():
    deepspeed_fastckpt.at_step_end(engine, save_dir)
"""
from .engine import FastckptEngine
from .interval import checkpoint_due
from .offload import offload_activations
from .preempt import at_step_end
from .register import register
from .settings import VALID as SETTINGS

register()

__all__ = ["FastckptEngine", "SETTINGS", "at_step_end", "checkpoint_due", "offload_activations", "register"]
