"""Run a function once a module has been imported, without importing it: how
`import deepspeed_fastckpt` registers with DeepSpeed yet imports DeepSpeed only when the
program does (so `fastckpt ls` of a Lightning folder, which loads this plugin's folder kind,
never pays for DeepSpeed's import or prints its accelerator warnings).

`after_import(name, then)`: then(module) runs right after the module `name` is imported (the
caller asks `sys.modules` first whether it already is). The hook is a finder at the front of `sys.meta_path` that finds
nothing itself: it asks the finders after it for the module's spec and wraps that spec's
loader's `exec_module`, then takes itself off the path. Python has no post-import hook of its
own (PEP 369 was withdrawn); this is the way import-time instrumentation (wrapt's, for one) does it.
"""
from __future__ import annotations

import importlib.abc
import sys
import threading
from typing import Callable


def after_import(name: str, then: Callable) -> None:
    if not any(isinstance(f, _AfterImport) and f.name == name and f.then is then for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, then))


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, then: Callable):
        self.name, self.then = name, then
        self._finding = threading.local()

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name or getattr(self._finding, "busy", False):
            return None
        self._finding.busy = True
        try:
            spec = next((s for s in (_spec_of(f, fullname, path, target) for f in sys.meta_path if f is not self)
                         if s is not None), None)
        finally:
            self._finding.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            self.then(module)

        spec.loader.exec_module = exec_module  # this module's own loader object (a new one per spec)
        return spec


def _spec_of(finder, fullname, path, target):
    find = getattr(finder, "find_spec", None)
    return find(fullname, path, target) if find is not None else None
