"""fastckpt for DeepSpeed: a `"fastckpt": {...}` entry in the DeepSpeed config selects
FastckptEngine (asynchronous, crash-safe checkpoints) once this package is imported.

    import deepspeed_fastckpt  # noqa: F401  (registers the engine with DeepSpeed)
    engine, *_ = deepspeed.initialize(model=model, config={..., "fastckpt": {"concurrency": 2}})
"""
from .engine import FastckptEngine
from .register import register
from .settings import VALID as SETTINGS

register()

__all__ = ["FastckptEngine", "SETTINGS", "register"]
