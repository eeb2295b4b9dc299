"""For DeepSpeed's own test suite: every DeepSpeed config gets a `"fastckpt": {}` entry.

run_suites.py puts this folder on PYTHONPATH, so every interpreter of the run — pytest and the
workers DeepSpeed's harness forks or spawns — imports it at start. It waits for `deepspeed`
to be imported (a meta path finder that wraps the package's loader), then imports
deepspeed_fastckpt (which registers fastckpt's checkpoint engine) and makes every
DeepSpeedConfig carry the entry unless it has one: fastckpt becomes the default engine.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

SETTINGS = {}  # the entry every config gets: fastckpt's defaults


def _after_deepspeed() -> None:
    from deepspeed.runtime import config as ds_config

    import deepspeed_fastckpt  # noqa: F401  (registers the engine)

    original = ds_config.DeepSpeedConfig.__init__
    if getattr(original, "__fastckpt_default__", False):
        return

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self._param_dict.setdefault("fastckpt", dict(SETTINGS))

    __init__.__fastckpt_default__ = True
    ds_config.DeepSpeedConfig.__init__ = __init__


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        _after_deepspeed()


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "deepspeed":
            return None
        sys.meta_path.remove(self)  # once: let the real finders find it
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


if "deepspeed" in sys.modules:
    _after_deepspeed()
else:
    sys.meta_path.insert(0, _Finder())
