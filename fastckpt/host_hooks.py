"""Fix-ups a plugin declares for its framework when that framework drives another plugin's
engine — the core runs them and knows none of them.

Lightning's DeepSpeedStrategy calls `deepspeed.initialize`, so the DeepSpeed plugin's engine
writes the checkpoints, while Lightning (ModelCheckpoint) removes the ones it no longer keeps.
What Lightning must do differently then is Lightning's plugin's business, not the DeepSpeed
plugin's: a plugin names an `install()` in the entry-point group `fastckpt.host_hooks`
(setup.cfg), and a plugin opening an engine calls `install()` here, which runs each of them
once per process. Each hook touches only a framework already imported (it never imports one),
so a hook of a framework not in use costs nothing; a hook that fails is logged and left out.
"""
from __future__ import annotations

import logging
import threading
from importlib.metadata import entry_points

log = logging.getLogger("fastckpt")
GROUP = "fastckpt.host_hooks"
_lock = threading.Lock()
_done: set[str] = set()


def install() -> None:
    """Runs every installed plugin's host hook (each once it succeeded; idempotent)."""
    with _lock:
        for ep in entry_points(group=GROUP):
            if ep.value in _done:
                continue
            try:
                if ep.load()():  # True: installed; False: its framework is not imported yet
                    _done.add(ep.value)
            except ImportError as e:  # its plugin's framework is not installed here
                _done.add(ep.value)
                log.debug("fastckpt: the host hook %s (%s) is not available: %s", ep.name, ep.value, e)
            except Exception as e:  # noqa: BLE001 - one plugin's hook must not stop another's engine
                _done.add(ep.value)
                log.warning("fastckpt: the host hook %s (%s) failed: %s", ep.name, ep.value, e)
