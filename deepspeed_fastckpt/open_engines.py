"""Every FastckptEngine of this process that is still open, and what is asked of all of them.

A load of a save_dir waits for every open engine's saves into it (a second engine in the same
process must see the first one's checkpoint still in flight); at exit each engine still open
closes, so the last tags of a script that never called engine.destroy() land and commit.
"""
from __future__ import annotations

import atexit
import logging
import weakref

log = logging.getLogger(__name__)
_open = weakref.WeakSet()


def opened(engine) -> None:
    _open.add(engine)


def closed(engine) -> None:
    _open.discard(engine)


def wait_for_saves_into(save_dir: str) -> None:
    """Until every save of this process into save_dir has committed or failed (any open engine's)."""
    for engine in list(_open):
        engine.committer.wait_for(save_dir)


@atexit.register
def _close_at_exit() -> None:
    """A script that ends without engine.destroy(): the last tags still land and commit."""
    for engine in list(_open):
        try:
            engine.close()
        except Exception as e:  # noqa: BLE001 - nobody is left to raise to
            log.error("fastckpt: a DeepSpeed checkpoint did not complete at exit: %s", e)
