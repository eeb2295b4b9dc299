"""Lightning's DeepSpeedStrategy removing a checkpoint whose save is still in flight.

ModelCheckpoint drops a checkpoint it no longer keeps (save_top_k) right after issuing the
next save, through `strategy.remove_checkpoint(dir)`, which deletes the directory at once.
With fastckpt that directory's tag may still be landing: its files and commit record would
be written into a directory being deleted (a failed tag, or a delete that fails on a file
that appeared meanwhile). Wrapped here, the removal of a directory with a save of this
process in flight is handed to that engine's committer (deepspeed_fastckpt.tags: deleted
once the save lands, never committed) and returns at once; any other removal is Lightning's.
Installed on whichever Lightning package is already imported when a fastckpt engine is made
(DeepSpeedStrategy imports it before it calls deepspeed.initialize).
"""
from __future__ import annotations

import functools
import sys

from .open_engines import withdraw_saves_into

_MARK = "__fastckpt_defers__"


def _deferring(original):
    @functools.wraps(original)
    def remove_checkpoint(self, filepath) -> None:
        if self.is_global_zero and withdraw_saves_into(str(filepath)):
            return
        original(self, filepath)

    setattr(remove_checkpoint, _MARK, True)
    return remove_checkpoint


def install() -> None:
    """Idempotent; a Lightning not imported (or without DeepSpeedStrategy) is left alone."""
    for module in (sys.modules.get("lightning.pytorch.strategies.deepspeed"),
                   sys.modules.get("pytorch_lightning.strategies.deepspeed")):
        strategy = getattr(module, "DeepSpeedStrategy", None)
        if strategy is not None and not getattr(strategy.remove_checkpoint, _MARK, False):
            strategy.remove_checkpoint = _deferring(strategy.remove_checkpoint)
