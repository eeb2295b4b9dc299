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
from lightning.pytorch.strategies import ModelParallelStrategy

import fastckpt
from fastckpt.settings import CheckpointerConfig
from fastckpt.errors import ConfigError
from fastckpt.dcp import FastStager, FastStorageReader, FastStorageWriter
from fastckpt.dcp.writer import RECORD
from fastckpt.fsutil import fsync_dir


_METADATA_FILENAME = "meta.pt"  # the rest of a Lightning checkpoint, the name Lightning's own loader reads


class FastModelParallelStrategy(ModelParallelStrategy):
    """ModelParallelStrategy's arguments, and `fastckpt`: a dict of Checkpointer settings (or a
    CheckpointerConfig); None: the defaults."""

    def __init__(self, *args, fastckpt=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._fastckpt = fastckpt if isinstance(fastckpt, CheckpointerConfig) else \
            CheckpointerConfig.from_dict(dict(fastckpt or {}))  # checked now, before any process starts
        if self._fastckpt.policy != "wait":
            raise ConfigError("FastModelParallelStrategy saves with policy='wait' (a skipped save would leave "
                              "Lightning's ModelCheckpoint believing it saved)")
        self._writer: Optional[FastStorageWriter] = None
        self._stager: Optional[FastStager] = None
        self._group = None
        self._saving: dict[str, tuple[int, Any, Path]] = {}  # directory -> (save number, DCP's response, written into)
        self._saves = 0
        self._committed = -1  # the number of the newest save known committed
        self._deferred: list[tuple[str, int]] = []  # (directory, the saves issued before its removal)
        self.stager_stats: dict = {}  # the last run's FastStager counts (after teardown)

    # -- saving ----------------------------------------------------------
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options: Optional[Any] = None) -> None:
        if not self._save_distributed_checkpoint:  # one full file: Lightning's path (through the CheckpointIO)
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        if storage_options is not None:
            raise TypeError(f"`{type(self).__name__}.save_checkpoint(..., storage_options=...)` is not supported")
        path = Path(self.broadcast(filepath))
        self._landed()  # every rank: a failed earlier save is raised on every rank, before any collective
        self._land(str(path))  # the previous save into this directory lands first
        self._deferred = [(k, n) for k, n in self._deferred if k != str(path)]  # saved again: not removed
        self._remove_due()
        into = None
        if self.global_rank == 0:
            into = _prepare(path)
            fastckpt.save(checkpoint_rest(checkpoint), into / _METADATA_FILENAME)
        into = Path(self.broadcast(str(into)))  # rank 0 decided where this save is written
        self.barrier("fastckpt-dcp-save")  # nobody writes into the directory before it is ready
        state = {"state_dict": checkpoint.pop("state_dict")}
        state.update({f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states", []))})
        writer, stager, group = self._parts(into)
        writer.expect(into, int(checkpoint.get("global_step", -1)), [_METADATA_FILENAME] if self.global_rank == 0 else [])
        response = dcp.async_save(state, checkpoint_id=into, storage_writer=writer, async_stager=stager,
                                  process_group=group)
        self._saving[str(path)] = (self._saves, response, into)
        self._saves += 1

    def _parts(self, path: Path):
        if self._writer is None:
            settings = self._fastckpt  # the writer and stager set where and who themselves
            self._group = dist.new_group(backend="gloo")  # DCP's collectives apart from training's
            self._writer = FastStorageWriter(path, settings=settings)
            self._stager = FastStager(settings=settings, writer=self._writer)
        return self._writer, self._stager, self._group

    def _land(self, key: str) -> None:
        """Waits for the save into `key` (if one is in flight); raises its error."""
        entry = self._saving.pop(key, None)
        if entry is not None:
            number, response, into = entry
            response.upload_completion.result()
            if self.global_rank == 0 and str(into) != key:  # committed beside the old one: swapped in
                _swap_in(Path(key), into)
            self._committed = max(self._committed, number)

    def _landed(self) -> None:
        """Lands the saves that rank 0 sees finished, on every rank (a rank not done with one yet
        waits for it: briefly, as rank 0's save ends with DCP's last collective); raises the first
        failed one's error on every rank alike. Each rank judging by its own futures could raise on
        one rank while the other went on to the next collective."""
        done = None
        if self.global_rank == 0:
            done = [key for key, (_, response, _) in self._saving.items() if response.upload_completion.done()]
        for key in self.broadcast(done):
            self._land(key)

    # -- removing --------------------------------------------------------
    def remove_checkpoint(self, filepath) -> None:
        """Deletes the checkpoint now if it is not being written and a checkpoint saved after it was
        issued is committed; otherwise as soon as both hold. Never blocks."""
        self._landed()  # every rank (Lightning calls this on every rank)
        if self.global_rank != 0:
            return
        self._deferred.append((str(Path(filepath)), self._saves))
        self._remove_due()

    def _remove_due(self) -> None:
        """Rank 0 deletes what may go now (after _landed() on every rank noted what finished)."""
        if self.global_rank != 0:
            return
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
        self._land(str(path))
        if self.global_rank == 0:
            recover(path)  # a swap cut short by a crash is finished first
        self.barrier("fastckpt-dcp-load")
        if not path.is_dir():  # a full checkpoint file: Lightning's own path
            return super().load_checkpoint(checkpoint_path, weights_only=weights_only)
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

    # -- what is saved ------------------------------------------------------
    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The sharded state as it lives (Lightning's copies it to the CPU first, on the training
        thread: FastStager copies it off that thread, only what the next step will change)."""
        if not self._save_distributed_checkpoint:
            return super().lightning_module_state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        return get_model_state_dict(self.model, options=StateDictOptions(cpu_offload=False))

    def optimizer_state(self, optimizer) -> dict[str, Any]:
        if not self._save_distributed_checkpoint:
            return super().optimizer_state(optimizer)
        from lightning.pytorch.core.optimizer import LightningOptimizer
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer.optimizer
        return get_optimizer_state_dict(self.model, optimizer, options=StateDictOptions(cpu_offload=False))

    # -- the end -----------------------------------------------------------
    def teardown(self) -> None:
        """Every save in flight lands (the first error is raised once everything is closed), the
        removals due are done, the stager, writer and their group are closed."""
        errors: list[BaseException] = []
        for key in list(self._saving):
            try:
                self._land(key)
            except BaseException as e:  # noqa: BLE001 - each one lands; the first is raised
                errors.append(e)
        for step in (self._remove_due, self._close_parts, self.checkpoint_io.teardown, super().teardown):
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


NEW, OLD = ".fastckpt-new", ".fastckpt-old"  # beside a committed directory saved into again


def _beside(path: Path, suffix: str) -> Path:
    return path.parent / f".{path.name}{suffix}"


def _committed(path: Path) -> bool:
    return (path / RECORD).is_file()


def _prepare(path: Path) -> Path:
    """Where a save into `path` is written (rank 0): a directory that holds a committed checkpoint
    is never withdrawn while the new one is written (ModelCheckpoint's last.ckpt is saved into
    again and again; a crash then would leave none): the save goes into a hidden sibling,
    swapped in once committed. Anything else is prepared in place."""
    recover(path)
    if path.is_dir() and _committed(path):
        into = _beside(path, NEW)
        shutil.rmtree(into, ignore_errors=True)
        into.mkdir()
        fsync_dir(str(path.parent))
        return into
    _withdraw(path)
    return path


def _swap_in(path: Path, new: Path) -> None:
    """The committed `new` takes `path`'s place (rank 0); the old one goes. A crash in between
    leaves both hidden siblings, which recover() sorts out."""
    old = _beside(path, OLD)
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        os.rename(path, old)
    os.rename(new, path)
    fsync_dir(str(path.parent))
    shutil.rmtree(old, ignore_errors=True)


def recover(path: Path) -> None:
    """Finishes what a crash cut short around `path` (rank 0): a committed new sibling whose swap
    did not happen takes the place; an old one whose place is empty goes back; leftovers go."""
    new, old = _beside(path, NEW), _beside(path, OLD)
    if not path.exists():
        back = new if new.is_dir() and _committed(new) else old if old.is_dir() and _committed(old) else None
        if back is not None:
            os.rename(back, path)
            fsync_dir(str(path.parent))
    for leftover in (new, old):  # the caller has landed any save into path: these are stale
        if leftover.exists():
            shutil.rmtree(leftover, ignore_errors=True)


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
