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
import importlib
import sys
from types import ModuleType
from typing import Any

from fastckpt.session import front_ends

from .on_import import after_import

__all__ = ["FastckptEngine", "SETTINGS", "at_step_end", "checkpoint_due", "offload_activations", "register"]


# each public name: the module it is defined in, and its name there
_WHERE = {"FastckptEngine": ("engine", "FastckptEngine"), "checkpoint_due": ("interval", "checkpoint_due"),
          "offload_activations": ("offload", "offload_activations"), "at_step_end": ("preempt", "at_step_end"),
          "register": ("register", "register"), "SETTINGS": ("settings", "VALID")}
_IMPORT_DEEPSPEED = {"engine", "interval", "preempt", "register"}  # the modules that import DeepSpeed


def __getattr__(name: str) -> Any:
    """The public names, imported on first use (this package's folder kind, which `fastckpt ls`
    loads, must not import DeepSpeed). A name whose module imports DeepSpeed has it imported
    first, so that this plugin registers then, not halfway through that module's own import."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _WHERE[name]
    if module in _IMPORT_DEEPSPEED:  # DeepSpeed imported first, so that this plugin registers
        importlib.import_module("deepspeed")  # then, and not halfway through that module's own import
    value = getattr(importlib.import_module(f".{module}", __name__), attr)
    globals()[name] = value  # "register": the function, not the submodule its import bound here
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

