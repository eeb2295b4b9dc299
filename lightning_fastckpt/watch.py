"""What fastckpt adds to a Trainer it was not given to directly, as one Lightning callback.

Lightning adds to every Trainer the callbacks that installed packages name in the entry-point
group `lightning.pytorch.callbacks_factory` (setup.cfg names lightning_fastckpt.callbacks). It
returns `FastckptWatch` only while a FastCheckpointIO exists in the process or after the
DeepSpeed plugin was imported (the factory is not told which Trainer it is called for), and the
callback acts only on the strategies it concerns; no Lightning class is changed.

- A strategy that saves distributed checkpoints itself with PyTorch DCP — ModelParallelStrategy
  (save_distributed_checkpoint=True, its default) and FSDPStrategy(state_dict_type="sharded") —
  never calls its CheckpointIO for them, so a FastCheckpointIO given to it would be silently
  unused: rank 0 is told so once per process, before the first save, with what to use instead
  (FastModelParallelStrategy; lightning_fastckpt.bypass_warning). Lightning exposes neither setting publicly; they are read from
  the strategy's `_save_distributed_checkpoint` / `_state_dict_type`, and a strategy lacking
  them is taken as not bypassing.
- A Trainer of several ranks whose rank 0 alone saves through a FastCheckpointIO (DDP): a save
  that failed in the background would be raised on rank 0 alone, inside Trainer.save_checkpoint,
  while the other ranks wait in its barrier until the process group times out. So at every
  `Trainer.save_checkpoint` (`on_save_checkpoint`, on every rank, before the strategy hands the
  checkpoint to rank 0) the ranks agree in one collective — the strategy's
  `reduce_boolean_decision` — and every rank raises, or none (FastCheckpointIO.raise_agreed).
- Lightning's DeepSpeedStrategy whose config has a "fastckpt" entry (read from the strategy's
  public `config`; deepspeed_fastckpt is never imported here): DeepSpeed's engine (the DeepSpeed plugin's) writes the checkpoints, while ModelCheckpoint drops one it no longer keeps
  (save_top_k) right after issuing the next save, through the strategy's CheckpointIO, which
  deletes the directory at once — a tag possibly still landing there. The strategy's
  CheckpointIO is wrapped (DeferredRemoval, through the public `strategy.checkpoint_io`): the
  removal of a directory with a save of this process in flight is withdrawn from fastckpt's
  commit (fastckpt.commit.file_sets.withdraw_anywhere: deleted once the save lands, never
  committed) and returns at once; any other removal is the wrapped CheckpointIO's.
"""
from __future__ import annotations

import sys
from typing import Any, Optional

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.io import CheckpointIO

from fastckpt.session import withdraw_anywhere

from .bypass_warning import say_bypassed

DEEPSPEED_ENTRY = "fastckpt"  # the key of fastckpt's entry in a DeepSpeed config (deepspeed_fastckpt.settings)


def bypasses_its_checkpoint_io(strategy) -> bool:
    """Whether the strategy writes its distributed checkpoints without its CheckpointIO."""
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
    if isinstance(strategy, ModelParallelStrategy):
        from .model_parallel import FastModelParallelStrategy
        return not isinstance(strategy, FastModelParallelStrategy) and getattr(strategy, "_save_distributed_checkpoint",
                                                                              False) is True
    if isinstance(strategy, FSDPStrategy):
        return getattr(strategy, "_state_dict_type", None) == "sharded"
    return False


def given_io(strategy) -> Optional[CheckpointIO]:
    """The strategy's CheckpointIO, or the one a wrapper of it (AsyncCheckpointIO) holds, if it is ours."""
    if "lightning_fastckpt.checkpoint_io" not in sys.modules:  # then none is ours
        return None
    from .checkpoint_io import FastCheckpointIO
    io = strategy.checkpoint_io
    for candidate in (io, getattr(io, "checkpoint_io", None)):
        if isinstance(candidate, FastCheckpointIO):
            return candidate
    return None


class FastckptWatch(Callback):
    """See the module docstring. Holds no state (nothing of it goes into a checkpoint)."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        strategy = trainer.strategy
        io = given_io(strategy)
        if trainer.is_global_zero and bypasses_its_checkpoint_io(strategy) and io is not None:
            say_bypassed(f"{type(strategy).__name__} saves its distributed checkpoints itself")
        if _drives_a_fastckpt_engine(strategy) and not isinstance(strategy.checkpoint_io, DeferredRemoval):
            strategy.checkpoint_io = DeferredRemoval(strategy.checkpoint_io)
        if io is not None and trainer.world_size > 1 and not io.per_rank:  # rank 0 alone saves through it
            io.agree_on_errors(lambda raising: strategy.reduce_boolean_decision(raising, all=False))

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        """Every rank, inside Trainer.save_checkpoint before the strategy hands the checkpoint to
        rank 0's CheckpointIO: a failed earlier save is raised on every rank here, or on none."""
        io = given_io(trainer.strategy)
        if io is not None:
            io.raise_agreed()

    def teardown(self, trainer, pl_module, stage: str) -> None:
        io = given_io(trainer.strategy)
        if io is not None:
            io.agree_on_errors(None)  # its teardown raises what is left, on the rank that saved


def _drives_a_fastckpt_engine(strategy) -> bool:
    from lightning.pytorch.strategies import DeepSpeedStrategy
    if not isinstance(strategy, DeepSpeedStrategy) or not isinstance(strategy.config, dict):
        return False
    entry = strategy.config.get(DEEPSPEED_ENTRY)
    return entry is not None and entry is not False


class DeferredRemoval(CheckpointIO):
    """A CheckpointIO whose removal of a directory still being saved by fastckpt is deferred; the
    rest is the wrapped CheckpointIO's."""

    def __init__(self, checkpoint_io: CheckpointIO):
        self.checkpoint_io = checkpoint_io

    def save_checkpoint(self, checkpoint: dict, path, storage_options: Optional[Any] = None) -> None:
        self.checkpoint_io.save_checkpoint(checkpoint, path, storage_options)

    def load_checkpoint(self, path, map_location: Optional[Any] = None, **kwargs: Any) -> dict:
        return self.checkpoint_io.load_checkpoint(path, map_location, **kwargs)

    def remove_checkpoint(self, path) -> None:
        if withdraw_anywhere(str(path)):
            return
        self.checkpoint_io.remove_checkpoint(path)

    def teardown(self) -> None:
        self.checkpoint_io.teardown()
