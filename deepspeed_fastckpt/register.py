"""Hooks fastckpt into DeepSpeed when `deepspeed_fastckpt` is imported.

DeepSpeedEngine offers no hook for three things, so three of its methods are wrapped — each a
no-op unless the engine's config has a "fastckpt" entry — and nothing else of it is replaced:
- `_configure_checkpointing`: DeepSpeed builds its checkpoint engine there from the JSON config
  and lets no one choose it; with the entry the engine gets a FastckptEngine instead (the entry
  is validated first: unknown keys are a ConfigError), told which tensors the optimizer update
  alone rewrites and which group of DeepSpeed's optimizer rewrites them. The engine's module
  hooks (deepspeed_fastckpt.engine_hooks: activation offload, interval="auto") are registered
  there too.
- `load_checkpoint(dir, tag=None)`: DeepSpeed reads its `latest` file itself before it calls
  the checkpoint engine at all, so a save of this process still in flight, or a `latest` that
  names a tag a crash cut short, could only be refused after the tag is chosen. Wrapped, every
  save of this process into dir lands first, then the ranks agree on one tag
  (deepspeed_fastckpt.load_tag): what DeepSpeed would load, checked against fastckpt's commit
  records — a tag fastckpt never finished is not loaded (the newest committed one is, with a
  warning), a tag another engine wrote is loaded as DeepSpeed would and said so, and "nothing
  to load" is a warning, never silence.
- `destroy()`: waits until every tag in flight is committed and raises a write error (an
  interpreter exit without destroy() does the same, quietly logging errors). DeepSpeed calls
  the checkpoint engine's cleanup() from destroy() only for a decoupled engine, and only after
  it destroyed the optimizer whose tensors a save may still be copying.
DeepSpeed's offline readers (ds_to_universal, zero_to_fp32) run in-process wait for the
saves into their directory first (deepspeed_fastckpt.offline_readers).
This works the same under Lightning's DeepSpeedStrategy, which calls deepspeed.initialize;
what Lightning does differently then (its removal of a checkpoint still in flight) is the
Lightning plugin's callback (lightning_fastckpt.watch).
"""
from __future__ import annotations

import functools
import logging
import warnings

from fastckpt.errors import CorruptCheckpointError

from . import offline_readers, offload
from .settings import entry_of, offload_node

log = logging.getLogger(__name__)
_MARK = "__fastckpt_wrapped__"


def register() -> None:
    """Idempotent; called on import of deepspeed_fastckpt."""
    from deepspeed.runtime.engine import DeepSpeedEngine
    if getattr(DeepSpeedEngine._configure_checkpointing, _MARK, False):
        return
    DeepSpeedEngine._configure_checkpointing = _wrap_configure(DeepSpeedEngine._configure_checkpointing)
    DeepSpeedEngine.load_checkpoint = _wrap_load(DeepSpeedEngine.load_checkpoint)
    DeepSpeedEngine.destroy = _wrap_destroy(DeepSpeedEngine.destroy)
    offline_readers.register()


# The wrappers import the plugin's engine (and interval.py, which imports it) when they run, not
# this module: DeepSpeed's import may register the plugin halfway through the engine module's own
# import of DeepSpeed, and registering does not need it.

def _wrap_configure(original):
    @functools.wraps(original)
    def _configure_checkpointing(self, *args, **kwargs):
        entry = entry_of(self._config)
        if entry is None or entry is False:
            return original(self, *args, **kwargs)
        from . import interval
        from .engine import FastckptEngine
        engine = FastckptEngine(self._config, settings=entry)  # validates before anything is built
        original(self, *args, **kwargs)  # DeepSpeed's bookkeeping (which ranks write what)
        old, self.checkpoint_engine = self.checkpoint_engine, engine
        if old is not None and old.is_decoupled():
            old.cleanup()
        module_params = frozenset()
        if not self.zero_optimization_partition_weights():  # ZeRO-3 re-gathers them in forward
            module_params = frozenset(p.untyped_storage().data_ptr() for p in self.module.parameters())
        engine.configure(self.optimizer, module_params)
        if offload_node(entry) is not None:
            offload.attach(self, offload_node(entry))
        if isinstance(entry, dict):
            interval.attach(self, entry)
        return None

    setattr(_configure_checkpointing, _MARK, True)
    return _configure_checkpointing


def _wrap_destroy(original):
    @functools.wraps(original)
    def destroy(self, *args, **kwargs):
        from .engine import FastckptEngine
        engine = getattr(self, "checkpoint_engine", None)
        try:
            offload.close(self)
            if isinstance(engine, FastckptEngine):
                engine.close()  # everything in flight lands and its tag commits; raises its error
        finally:
            original(self, *args, **kwargs)

    return destroy


def _wrap_load(original):
    @functools.wraps(original)
    def load_checkpoint(self, load_dir, tag=None, *args, **kwargs):
        from .engine import FastckptEngine
        engine = self.checkpoint_engine
        if not isinstance(engine, FastckptEngine):
            return original(self, load_dir, tag, *args, **kwargs)
        universal = self.load_universal_checkpoint()
        choice = engine.tag_to_load(load_dir, tag, "latest_universal" if universal else "latest")
        if choice.error:
            raise CorruptCheckpointError(choice.error)
        if choice.warning:
            log.warning("fastckpt: %s", choice.warning)
            warnings.warn(f"fastckpt: {choice.warning}", stacklevel=2)
        if choice.tag is None:
            if universal:  # as DeepSpeed: a universal load without a tag to load is an error
                raise ValueError(f"fastckpt: {choice.warning}")
            return None, None
        return original(self, load_dir, choice.tag, *args, **kwargs)

    return load_checkpoint
