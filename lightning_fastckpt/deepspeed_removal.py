"""Lightning's DeepSpeedStrategy removing a checkpoint whose save is still in flight — the
Lightning side of a run where DeepSpeed's engine (the DeepSpeed plugin's) writes the checkpoints.

ModelCheckpoint drops a checkpoint it no longer keeps (save_top_k) right after issuing the
next save, through `strategy.remove_checkpoint(dir)`, which deletes the directory at once.
With fastckpt that directory's tag may still be landing: its files and commit record would
be written into a directory being deleted (a failed tag, or a delete that fails on a file
that appeared meanwhile). Wrapped here, the removal of a directory with a save of this
process in flight is withdrawn from fastckpt's commit (fastckpt.commit.file_sets.withdraw_anywhere:
deleted once the save lands, never committed) and returns at once; any other removal is
Lightning's. This is a host hook (entry points `fastckpt.host_hooks`, fastckpt.host_hooks): it
runs when a fastckpt engine opens, and wraps whichever Lightning is already imported
(DeepSpeedStrategy imports it before it calls deepspeed.initialize); it never imports Lightning,
and knows nothing of the DeepSpeed plugin.
"""
from __future__ import annotations

import functools
import sys

from fastckpt.commit.file_sets import withdraw_anywhere

_MARK = "__fastckpt_defers__"


def _deferring(original):
    @functools.wraps(original)
    def remove_checkpoint(self, filepath) -> None:
        if self.is_global_zero and withdraw_anywhere(str(filepath)):
            return
        original(self, filepath)

    setattr(remove_checkpoint, _MARK, True)
    return remove_checkpoint


def install() -> bool:
    """Idempotent. True once every Lightning's DeepSpeedStrategy imported so far is wrapped and
    one is; False while none is imported (the hook runs again at the next engine)."""
    wrapped = False
    for module in (sys.modules.get("lightning.pytorch.strategies.deepspeed"),
                   sys.modules.get("pytorch_lightning.strategies.deepspeed")):
        strategy = getattr(module, "DeepSpeedStrategy", None)
        if strategy is None:
            continue
        if not getattr(strategy.remove_checkpoint, _MARK, False):
            strategy.remove_checkpoint = _deferring(strategy.remove_checkpoint)
        wrapped = True
    return wrapped
