"""FastModelParallelStrategy: Lightning's ModelParallelStrategy (FSDP2 and tensor parallelism in
`configure_model`) with its distributed checkpoints saved, committed and read through fastckpt.dcp.

    from lightning_fastckpt import FastModelParallelStrategy
    trainer = Trainer(strategy=FastModelParallelStrategy(fastckpt={"concurrency": 2}), ...)

Why a strategy, not the CheckpointIO: for a distributed checkpoint, Lightning's
ModelParallelStrategy (as FSDPStrategy(state_dict_type="sharded")) calls DCP itself and never
reaches the CheckpointIO; its save_checkpoint, load_checkpoint and remove_checkpoint are the
hooks Lightning offers, and this class is ModelParallelStrategy with those three replaced.

- save: the checkpoint's directory is Lightning's (its DCP files plus `meta.pt`, the rest of the
  checkpoint, which rank 0 writes first with fastckpt.save). The model and optimizer states go
  through `dcp.async_save` with FastStorageWriter and FastStager on a gloo group of their own:
  save_checkpoint returns once the snapshot is issued; the next optimizer step waits only for
  its copy. The commit record (written last) names every file, `meta.pt` included. A directory
  holding a committed checkpoint that is saved into again (ModelCheckpoint's `last.ckpt`) keeps
  it until the new one is committed in a hidden sibling, which then takes its place (two
  renames; a crash between them is finished by the next save or load of that path).
- remove: a directory still being written, or one removed before a newer checkpoint is committed,
  is deleted later (at a later save or at teardown) — never the last good checkpoint.
  Both are fastckpt.dcp.saved_paths.SavedPaths' (this class only agrees across ranks, through
  Lightning's broadcast, on which saves finished).
- load: the model and optimizers through FastStorageReader (every item's CRC-32; a directory
  whose commit never happened is refused), `meta.pt` through fastckpt's restricted unpickler.
  A distributed checkpoint Lightning wrote itself loads too (without CRCs: one warning).
`fastckpt` takes the Checkpointer's settings (strategy, concurrency, policy, writers, chunk_mb,
stall_timeout_s, ...). Every save in flight lands at teardown; their errors are raised there.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Union, cast

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.optim import Optimizer

from fastckpt.session import CheckpointerConfig, load, save
from fastckpt.errors import ConfigError
from fastckpt.dcp import FastStager, FastStorageReader, FastStorageWriter, SavedPaths, recover


_METADATA_FILENAME = "meta.pt"  # the rest of a Lightning checkpoint, the name Lightning's own loader reads


class FastModelParallelStrategy(ModelParallelStrategy):
    """ModelParallelStrategy's arguments, and `fastckpt`: a dict of Checkpointer settings (or a
    CheckpointerConfig); None: the defaults."""

    def __init__(self, *args: Any, fastckpt: Union[CheckpointerConfig, Mapping[str, Any], None] = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fastckpt = fastckpt if isinstance(fastckpt, CheckpointerConfig) else \
            CheckpointerConfig.from_dict(dict(fastckpt or {}))  # checked now, before any process starts
        if self._fastckpt.policy != "wait":
            raise ConfigError("FastModelParallelStrategy saves with policy='wait' (a skipped save would leave "
                              "Lightning's ModelCheckpoint believing it saved)")
        self._writer: Optional[FastStorageWriter] = None
        self._stager: Optional[FastStager] = None
        self._group: Optional[dist.ProcessGroup] = None
        self._paths: Optional[SavedPaths] = None  # the saves by path (made once the ranks are known)
        self.stager_stats: dict = {}  # the last run's FastStager counts (after teardown)

    # -- saving ----------------------------------------------------------
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Union[str, Path],
                        storage_options: Optional[Any] = None) -> None:
        if not self._save_distributed_checkpoint:  # one full file: Lightning's path (through the CheckpointIO)
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        if storage_options is not None:
            raise TypeError(f"`{type(self).__name__}.save_checkpoint(..., storage_options=...)` is not supported")
        path = Path(self.broadcast(filepath))
        self._landed()  # every rank: a failed earlier save is raised on every rank, before any collective
        self.paths.land(path)  # the previous save into this directory lands first
        into = self.paths.prepare(path)
        self.paths.remove_due()
        if self.global_rank == 0:
            save(checkpoint_rest(checkpoint), into / _METADATA_FILENAME)
        into = Path(self.broadcast(str(into)))  # rank 0 decided where this save is written
        self.barrier("fastckpt-dcp-save")  # nobody writes into the directory before it is ready
        state = {"state_dict": checkpoint.pop("state_dict")}
        state.update({f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states", []))})
        writer, stager, group = self._parts(into)
        writer.expect(into, int(checkpoint.get("global_step", -1)), [_METADATA_FILENAME] if self.global_rank == 0 else [])
        response = dcp.async_save(state, checkpoint_id=into, storage_writer=writer, async_stager=stager,
                                  process_group=group)
        self.paths.issued(path, into, response)

    @property
    def paths(self) -> SavedPaths:
        if self._paths is None:
            self._paths = SavedPaths(coordinator=self.global_rank == 0)
        return self._paths

    def _parts(self, path: Path) -> tuple[FastStorageWriter, FastStager, Optional[dist.ProcessGroup]]:
        if self._writer is None:
            settings = self._fastckpt  # the writer and stager set where and who themselves
            self._group = dist.new_group(backend="gloo")  # DCP's collectives apart from training's
            self._writer = FastStorageWriter(path, settings=settings)
            self._stager = FastStager(settings=settings, writer=self._writer)
        assert self._stager is not None  # made with the writer (and closed with it)
        return self._writer, self._stager, self._group

    def _landed(self) -> None:
        """Lands the saves that rank 0 sees finished, on every rank (a rank not done with one yet
        waits for it: briefly, as rank 0's save ends with DCP's last collective); raises the first
        failed one's error on every rank alike. Each rank judging by its own futures could raise on
        one rank while the other went on to the next collective."""
        done = self.paths.finished() if self.global_rank == 0 else None
        for key in cast(list[str], self.broadcast(done)):  # rank 0's list, on every rank
            self.paths.land(key)

    # -- removing --------------------------------------------------------
    def remove_checkpoint(self, filepath: Union[str, Path]) -> None:
        """Deletes the checkpoint now if it is not being written and a checkpoint saved after it was
        issued is committed; otherwise as soon as both hold. Never blocks."""
        self._landed()  # every rank (Lightning calls this on every rank)
        self.paths.remove(filepath)

    # -- loading ---------------------------------------------------------
    def load_checkpoint(self, checkpoint_path: Union[str, Path],
                        weights_only: Optional[bool] = None) -> dict[str, Any]:
        path = Path(self.broadcast(checkpoint_path))
        self.paths.land(path)
        if self.global_rank == 0:
            recover(path)  # a swap cut short by a crash is finished first
        self.barrier("fastckpt-dcp-load")
        if not path.is_dir():  # a full checkpoint file: Lightning's own path
            return super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions, get_model_state_dict, get_optimizer_state_dict, set_optimizer_state_dict)
        module, lightning_module = self.model, self.lightning_module
        if module is None or lightning_module is None:
            raise RuntimeError(f"{type(self).__name__}.load_checkpoint: no model is attached to the strategy")
        state = {"state_dict": get_model_state_dict(module)}
        dcp.load(state, storage_reader=FastStorageReader(path))
        module.load_state_dict(state["state_dict"], strict=lightning_module.strict_loading)
        for i, optimizer in enumerate(self.optimizers):  # each one separately, as Lightning loads them
            key = f"optimizer_{i}"
            osd = {key: get_optimizer_state_dict(module, optimizer)}
            dcp.load(osd, storage_reader=FastStorageReader(path))
            set_optimizer_state_dict(module, optimizer, optim_state_dict=osd[key],
                                     options=StateDictOptions(cpu_offload=True))
        return load(path / _METADATA_FILENAME, weights_only=True if weights_only is None else weights_only)

    # -- what is saved ------------------------------------------------------
    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The sharded state as it lives (Lightning's copies it to the CPU first, on the training
        thread: FastStager copies it off that thread, only what the next step will change)."""
        if not self._save_distributed_checkpoint:
            return super().lightning_module_state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        if self.model is None:
            raise RuntimeError(f"{type(self).__name__}.lightning_module_state_dict: no model is attached to it")
        return get_model_state_dict(self.model, options=StateDictOptions(cpu_offload=False))

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        if not self._save_distributed_checkpoint:
            return super().optimizer_state(optimizer)
        from lightning.pytorch.core.optimizer import LightningOptimizer
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer.optimizer
        if self.model is None:
            raise RuntimeError(f"{type(self).__name__}.optimizer_state: no model is attached to the strategy")
        return get_optimizer_state_dict(self.model, optimizer, options=StateDictOptions(cpu_offload=False))

    # -- the end -----------------------------------------------------------
    def teardown(self) -> None:
        """Every save in flight lands (the first error is raised once everything is closed), the
        removals due are done, the stager, writer and their group are closed."""
        errors: list[BaseException] = []
        for key in self.paths.in_flight():
            try:
                self.paths.land(key)
            except BaseException as e:  # noqa: BLE001 - each one lands; the first is raised
                errors.append(e)
        for step in (self.paths.remove_due, self._close_parts, self.checkpoint_io.teardown, super().teardown):
            try:  # ModelParallelStrategy.teardown never calls the CheckpointIO's (a full checkpoint's)
                step()
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
        if errors:
            raise errors[0]

    def _close_parts(self) -> None:
        stager, writer, group = self._stager, self._writer, self._group
        self._stager = self._writer = self._group = None
        try:
            if stager is not None:
                self.stager_stats = dict(stager.stats)
                stager.close()
        finally:
            try:
                if writer is not None:
                    writer.close()
            finally:
                if group is not None and dist.is_initialized():
                    dist.destroy_process_group(group)


def checkpoint_rest(checkpoint: dict) -> dict:
    """What Lightning keeps in meta.pt: the checkpoint but its model and optimizer states."""
    return {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states")}


__all__ = ["FastModelParallelStrategy"]
