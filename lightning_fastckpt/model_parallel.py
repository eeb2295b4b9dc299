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
  its copy. The commit record (written last) names every file, `meta.pt` included. Saving again
  into a directory first withdraws its record, so it is never taken for committed while rewritten.
- remove: a directory still being written, or one removed before a newer checkpoint is committed,
  is deleted later (at a later save or at teardown) — never the last good checkpoint.
- load: the model and optimizers through FastStorageReader (every item's CRC-32; a directory
  whose commit never happened is refused), `meta.pt` through fastckpt's restricted unpickler.
  A distributed checkpoint Lightning wrote itself loads too (without CRCs: one warning).
`fastckpt` takes the Checkpointer's settings (strategy, concurrency, policy, writers, chunk_mb,
stall_timeout_s, ...). Every save in flight lands at teardown; their errors are raised there.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Optional

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from lightning.fabric.utilities.load import _METADATA_FILENAME
from lightning.pytorch.strategies import ModelParallelStrategy

import fastckpt
from fastckpt.config import CheckpointerConfig
from fastckpt.dcp import FastStager, FastStorageReader, FastStorageWriter
from fastckpt.dcp.writer import RECORD
from fastckpt.fsutil import fsync_dir


class FastModelParallelStrategy(ModelParallelStrategy):
    """ModelParallelStrategy's arguments, and `fastckpt`: a dict of Checkpointer settings (or a
    CheckpointerConfig); None: the defaults."""

    def __init__(self, *args, fastckpt=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._fastckpt = fastckpt if isinstance(fastckpt, CheckpointerConfig) else \
            CheckpointerConfig.from_dict(dict(fastckpt or {}))  # checked now, before any process starts
        self._writer: Optional[FastStorageWriter] = None
        self._stager: Optional[FastStager] = None
        self._group = None
        self._saving: dict[str, tuple[int, Any]] = {}  # directory -> (its save's number, DCP's response)
        self._saves = 0
        self._committed = -1  # the number of the newest save known committed
        self._deferred: list[tuple[str, int]] = []  # (directory, the saves issued before its removal)

    # -- saving ----------------------------------------------------------
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options: Optional[Any] = None) -> None:
        if not self._save_distributed_checkpoint:  # one full file: Lightning's path (through the CheckpointIO)
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        if storage_options is not None:
            raise TypeError(f"`{type(self).__name__}.save_checkpoint(..., storage_options=...)` is not supported")
        path = Path(self.broadcast(filepath))
        self._land(str(path))  # the previous save into this directory lands first
        self._remove_due()
        if self.global_rank == 0:
            _withdraw(path)
            fastckpt.save(checkpoint_rest(checkpoint), path / _METADATA_FILENAME)
        self.barrier("fastckpt-dcp-save")  # nobody writes into the directory before it is ready
        state = {"state_dict": checkpoint.pop("state_dict")}
        state.update({f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states", []))})
        writer, stager, group = self._parts(path)
        writer.expect(path, int(checkpoint.get("global_step", -1)), [_METADATA_FILENAME] if self.global_rank == 0 else [])
        response = dcp.async_save(state, checkpoint_id=path, storage_writer=writer, async_stager=stager,
                                  process_group=group)
        self._saving[str(path)] = (self._saves, response)
        self._saves += 1

    def _parts(self, path: Path):
        if self._writer is None:
            settings = {k: v for k, v in vars(self._fastckpt).items()
                        if k not in ("root", "store", "keep", "distributed", "model")}
            self._group = dist.new_group(backend="gloo")  # DCP's collectives apart from training's
            self._writer = FastStorageWriter(path, settings=settings)
            self._stager = FastStager(settings=settings)
        return self._writer, self._stager, self._group

    def _land(self, key: str) -> None:
        """Waits for the save into `key` (if one is in flight); raises its error."""
        entry = self._saving.pop(key, None)
        if entry is not None:
            number, response = entry
            response.upload_completion.result()
            self._committed = max(self._committed, number)

    def _landed(self) -> None:
        """Notes the saves that have finished (without waiting); raises the first failed one's error."""
        for key, (number, response) in list(self._saving.items()):
            if response.upload_completion.done():
                self._land(key)

    # -- removing --------------------------------------------------------
    def remove_checkpoint(self, filepath) -> None:
        """Deletes the checkpoint now if it is not being written and a checkpoint saved after it was
        issued is committed; otherwise as soon as both hold. Never blocks."""
        if self.global_rank != 0:
            return
        self._deferred.append((str(Path(filepath)), self._saves))
        self._remove_due()

    def _remove_due(self) -> None:
        if self.global_rank != 0:
            return
        self._landed()
        still = []
        for key, issued in self._deferred:
            if key in self._saving or self._committed < issued - 1 or self._committed < 0:
                still.append((key, issued))
            elif os.path.isdir(key):
                _withdraw(Path(key))  # no longer committed before its files go
                shutil.rmtree(key, ignore_errors=True)
            elif os.path.exists(key):
                os.remove(key)
        self._deferred = still

    # -- loading ---------------------------------------------------------
    def load_checkpoint(self, checkpoint_path, weights_only: Optional[bool] = None) -> dict[str, Any]:
        path = Path(self.broadcast(checkpoint_path))
        if not path.is_dir():  # a full checkpoint file: Lightning's own path
            return super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        self._land(str(path))
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions, get_model_state_dict, get_optimizer_state_dict, set_optimizer_state_dict)
        module = self.model
        state = {"state_dict": get_model_state_dict(module)}
        dcp.load(state, storage_reader=FastStorageReader(path))
        module.load_state_dict(state["state_dict"], strict=self.lightning_module.strict_loading)
        for i, optimizer in enumerate(self.optimizers):  # each one separately, as Lightning loads them
            key = f"optimizer_{i}"
            osd = {key: get_optimizer_state_dict(module, optimizer)}
            dcp.load(osd, storage_reader=FastStorageReader(path))
            set_optimizer_state_dict(module, optimizer, optim_state_dict=osd[key],
                                     options=StateDictOptions(cpu_offload=True))
        return fastckpt.load(path / _METADATA_FILENAME, weights_only=True if weights_only is None else weights_only)

    # -- the end -----------------------------------------------------------
    def teardown(self) -> None:
        try:
            for key in list(self._saving):
                self._land(key)
            self._remove_due()
        finally:
            if self._stager is not None:
                self._stager.close()
            if self._writer is not None:
                self._writer.close()
            self._writer = self._stager = None
            self.checkpoint_io.teardown()  # ModelParallelStrategy.teardown never calls it (a full checkpoint's IO)
            super().teardown()


def checkpoint_rest(checkpoint: dict) -> dict:
    """What Lightning keeps in meta.pt: the checkpoint but its model and optimizer states."""
    return {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states")}


def _withdraw(path: Path) -> None:
    """The directory is no longer a committed checkpoint (its record goes first, durably)."""
    if path.is_file():
        path.unlink()
    path.mkdir(parents=True, exist_ok=True)
    record = path / RECORD
    if record.exists():
        record.unlink()
        fsync_dir(str(path))


__all__ = ["FastModelParallelStrategy"]
