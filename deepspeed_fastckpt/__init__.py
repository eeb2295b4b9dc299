"""fastckpt for DeepSpeed: a `"fastckpt": {...}` entry in the DeepSpeed config selects
FastckptEngine (asynchronous, crash-safe checkpoints) once this package is imported (before or
after DeepSpeed: it registers as DeepSpeed is imported; importing it does not import DeepSpeed).

    import deepspeed_fastckpt  # noqa: F401  (registers the engine with DeepSpeed)
    engine, *_ = deepspeed.initialize(model=model, config={..., "fastckpt": {"concurrency": 2}})
    # activation offload to SSD: "fastckpt": {"offload": {"threshold_mb": 1}} or
    deepspeed_fastckpt.offload_activations(engine, directory="/ssd/tmp", threshold_mb=1)
    # a checkpoint on SIGTERM: "fastckpt": {"preempt_signal": "SIGTERM"}, and after every engine.step():
    deepspeed_fastckpt.at_step_end(engine, save_dir)
"""
import sys
from types import ModuleType
from typing import Any

from fastckpt.session import front_ends

from .on_import import after_import

__all__ = ["FastckptEngine", "SETTINGS", "at_step_end", "checkpoint_due", "offload_activations", "register"]


def __getattr__(name: str) -> Any:
    """The public names, imported on first use (this package's folder kind, which `fastckpt ls`
    loads, must not import DeepSpeed)."""
    value: Any
    if name == "FastckptEngine":
        from .engine import FastckptEngine
        value = FastckptEngine
    elif name == "checkpoint_due":
        from .interval import checkpoint_due
        value = checkpoint_due
    elif name == "offload_activations":
        from .offload import offload_activations
        value = offload_activations
    elif name == "at_step_end":
        from .preempt import at_step_end
        value = at_step_end
    elif name == "register":
        from .register import register
        value = register
    elif name == "SETTINGS":
        from .settings import VALID
        value = VALID
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def _register(_deepspeed: ModuleType) -> None:
    from .register import register
    globals()["register"] = register  # the function, not the submodule its import bound here
    register()


front_ends.started("deepspeed")  # Lightning's DeepSpeedStrategy then gets lightning_fastckpt.watch's callback
if "deepspeed" in sys.modules:  # the program imported DeepSpeed first
    _register(sys.modules["deepspeed"])
else:  # once it does
    after_import("deepspeed", _register)

