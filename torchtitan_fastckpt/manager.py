"""torchtitan's CheckpointManager, saving and loading through fastckpt.dcp.

A subclass of torchtitan's own `CheckpointManager` (torchtitan.components.checkpointer.dcp) with
a `Config` of its own, so torchtitan's `build()` constructs it: switching a run over is the one
line `checkpoint=torchtitan_fastckpt.CheckpointManager.Config(...)` in its config. Everything
but the storage is torchtitan's: when to save, what the state is (model, optimizers, LR
schedulers, dataloader, train state), `load_step`, `keep_latest_k`, the last-step export, HF
safetensors. What changes:

- Saving. Every save goes through one `FastStorageWriter` (fastckpt's commit: every rank's file
  durable, `.metadata`, then the record), made with the manager and closed with it. In the
  `async` and `async_with_pinned_mem` modes, `dcp.async_save` stages through one `FastStager`
  (on torchtitan's own gloo group for checkpoints): the optimizer's tensors are handed on to the
  writer's save, which copies them as any fastckpt save does, and the step before the
  optimizer's waits only for that copy (torchtitan's `maybe_wait_for_staging`, fastckpt's gate). The two modes differ only in what torchtitan waits on; DCP's process-based upload of
  `async_with_pinned_mem` is not used (the writer is native threads).
- Concurrency. torchtitan waits for the previous save before each new one. Here, in the async
  modes, that wait is the stager's own: up to `concurrency` saves are staged or being written at
  once (policy 'wait' blocks for a slot, 'skip' skips the save on every rank), written one after
  another in order. An earlier save's failure is raised at the next save. The last step's save,
  `maybe_wait_for_saving()` and `close()` wait for every save in flight.
- Tiers (`tiers=["/dev/shm/run7"]`): a memory tier in front of the folder (FastStorageWriter /
  FastStorageReader's `tiers`): every rank's file commits in memory and is persisted to the
  folder before the record is written; a load reads each file from its memory copy on the node.
- Loading. "The newest" is fastckpt.dcp.newest_committed's: the newest step whose checkpoint a
  run can use, fastckpt's (committed) or DCP's own writer's (from before the switch: its
  `.metadata` and files' sizes checked) — one warning when it is DCP's, one naming the newer
  ones passed over. A save cut short (fastckpt's never-committed, a truncated rank file) is never
  picked; torchtitan's probe for `.metadata` would. `load_step=N` loads step-N as torchtitan
  does, through `FastStorageReader` (every item's CRC-32 checked; an uncommitted one refused).
- Retention (`keep_latest_k`, rank 0, torchtitan's purge thread). The newest k usable
  checkpoints are kept, never one in flight or newer than the newest usable: a step is pruned
  only once k newer ones are committed. Folders of saves cut short and older than the newest
  usable one (no rank writes them any more: saves are committed in order) are removed too.
  Each is withdrawn first (its record, then its `.metadata`), so a removal cut short never
  leaves something that looks resumable.
- A bucket (`folder="s3://bucket/run7"`, endpoint and credentials as AWS tools find them): saves and
  loads through fastckpt.dcp's object-store path, "the newest" is the newest committed there, and
  retention withdraws each checkpoint past `keep_latest_k` before torchtitan's purge thread deletes
  its objects (its own fsspec calls need s3fs); saves cut short there are swept by the next save.
"""
from __future__ import annotations

import logging
import os
from concurrent.futures import Future
import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType, AsyncSaveResponse
from torchtitan.components.checkpointer import MODEL, AsyncMode
from torchtitan.components.checkpointer import CheckpointManager as TitanCheckpointManager
from torchtitan.tools.utils import GarbageCollection

from fastckpt.session import DEFAULTS as D
from fastckpt.session import CheckpointerConfig
from fastckpt.dcp import (FastStager, FastStorageReader, FastStorageWriter, committed, cut_short_below, is_s3,
                          newest_committed, resumable, withdraw)

logger = logging.getLogger("fastckpt")

class CheckpointManager(TitanCheckpointManager):
    """torchtitan's CheckpointManager through fastckpt.dcp (see the module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(TitanCheckpointManager.Config):
        strategy: Literal["c", "g", "d"] = cast(Literal["c", "g", "d"], D.strategy)
        """fastckpt's snapshot of an async save: c host buffers, g spare device memory, d none
        (the optimizer step waits until the save is written)."""

        concurrency: int = D.concurrency
        """Async saves staged or being written at once (torchtitan alone allows one)."""

        writers: int = D.writers
        """Parallel writer threads per rank."""

        chunk_mb: int = D.chunk_mb
        """Staging chunk size in MiB."""

        policy: Literal["wait", "skip"] = cast(Literal["wait", "skip"], D.policy)
        """When `concurrency` saves are in flight: wait for one, or skip this save on every rank."""

        tiers: list[str] | None = None
        """A memory tier in front of the checkpoint folder, e.g. ["/dev/shm/run7"]: each rank's file
        commits there and is persisted to the folder from that copy; loads read each file from its
        memory copy on the node (docs/tiers.md). None: none."""

        tier_keep: list[int] | None = None
        """Files each rank keeps in the memory tier (None: 1)."""

        def __post_init__(self) -> None:
            TitanCheckpointManager.Config.__post_init__(self)
            self.fastckpt_settings()  # a bad value: one line (fastckpt.errors.ConfigError)

        def fastckpt_settings(self) -> CheckpointerConfig:
            """The fields this Config adds to torchtitan's: fastckpt settings (defaults from
            fastckpt.settings), of checkpoints named by their folders."""
            ours = {f.name for f in dataclasses.fields(self)} - {f.name for f in dataclasses.fields(TitanCheckpointManager.Config)}
            return CheckpointerConfig.from_dict(dict({name: getattr(self, name) for name in ours}, store="path"))

    def __init__(self, config: Config, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        if not self.enable:
            return
        settings = config.fastckpt_settings()
        self.tiers = config.tiers
        self.writer = FastStorageWriter(self.folder, settings=settings)
        self.reads: list[tuple[str, str]] = []  # with tiers: where each file of the last load came from
        # torchtitan's _save makes a DefaultStager only while self.stager is None
        self.stager = FastStager(settings, writer=self.writer) if self.async_mode != AsyncMode.DISABLED else None
        self.in_flight: list[tuple[str, Future]] = []  # (checkpoint_id, upload future), oldest first
        self._saving: tuple[bool, bool] = (False, False)  # (inside _save, its last_step)
        self._purging: set[str] = set()  # handed to torchtitan's purge thread, maybe not yet removed
        self._closed = False

    # -- torchtitan's storage calls ------------------------------------------
    @torch.no_grad()
    def dcp_save(self, state_dict: dict[str, Any], checkpoint_id: str, async_mode: AsyncMode,
                 enable_garbage_collection: bool = False,
                 to_hf: bool = False) -> Future | AsyncSaveResponse | None:
        if to_hf:  # the last step's export in HF safetensors: torchtitan's own writer
            return super().dcp_save(state_dict, checkpoint_id, async_mode, enable_garbage_collection, to_hf)
        if async_mode == AsyncMode.DISABLED:
            dcp.save(state_dict, storage_writer=self.writer, checkpoint_id=checkpoint_id)
            result: Future | AsyncSaveResponse | None = None
        else:
            # FastStager stages into a future, so DCP answers an AsyncSaveResponse
            response = cast(AsyncSaveResponse, dcp.async_save(
                state_dict, storage_writer=self.writer, checkpoint_id=checkpoint_id, process_group=self.pg,
                async_stager=self.stager, async_checkpointer_type=AsyncCheckpointerType.THREAD))
            self.in_flight.append((checkpoint_id, response.upload_completion))
            # what torchtitan's _save expects of each mode
            result = response if async_mode == AsyncMode.ASYNC_WITH_PINNED_MEM else response.upload_completion
        if enable_garbage_collection:
            GarbageCollection.collect("GC collection invoked by checkpointer.")
        return result

    def dcp_load(self, state_dict: dict[str, Any], checkpoint_id: str, from_hf: bool, from_quantized: bool) -> None:
        if from_hf:  # an initial load of HF safetensors: torchtitan's own reader
            return super().dcp_load(state_dict, checkpoint_id, from_hf, from_quantized)
        reader = FastStorageReader(checkpoint_id, tiers=self.tiers)
        dcp.load(state_dict, storage_reader=reader)
        self.reads = reader.reads
        if MODEL in self.states:  # torchtitan flattens the model's state into the top level
            self.states[MODEL].load_state_dict(state_dict)

    def _find_load_step(self, folder: str = "") -> int:
        newest = newest_committed(folder or self.folder)
        return -1 if newest is None else newest.step

    # -- waiting ----------------------------------------------------------------
    def _save(self, curr_step: int, last_step: bool = False) -> bool:
        self._saving = (True, last_step)
        try:
            return super()._save(curr_step, last_step)
        finally:
            self._saving = (False, False)

    def _maybe_wait_for_staging(self) -> None:
        # the step waits for the snapshot's copies alone (the gate), not for the save's turn to write
        self.staging_future = None
        if self.stager is not None:
            self.stager.synchronize_staging()

    def _wait_for_saving(self) -> None:
        inside, last = self._saving
        if inside and not last:  # a new save: the stager bounds what is in flight
            self._land(block=False)
        else:
            self._land(block=True)

    def _land(self, block: bool) -> None:
        """Takes the finished saves off in_flight (all of them: block), raising the first failure."""
        try:
            while self.in_flight and (block or self.in_flight[0][1].done()):
                _, future = self.in_flight.pop(0)
                future.result()
        finally:
            if not self.in_flight:
                self.save_future = None

    # -- retention ----------------------------------------------------------------
    def _purge_stale_checkpoints(self) -> None:
        if not self._should_purge():
            return
        if is_s3(self.folder):
            return self._purge_in_bucket()
        flying = {os.path.abspath(cid) for cid, future in self.in_flight if not future.done()}
        found = resumable(self.folder)
        doomed = [r.path for r in found[0][self.keep_latest_k:]] + cut_short_below(found)
        self._purging = {p for p in self._purging if os.path.exists(p)}
        for path in doomed:
            if os.path.abspath(path) not in flying and os.path.abspath(path) not in self._purging:
                withdraw(path)  # once: a folder withdrawn and queued looks cut short until the thread removes it
                self._purging.add(os.path.abspath(path))
                self.purge_queue.put(path)

    def _purge_in_bucket(self) -> None:
        """The committed checkpoints past the newest keep_latest_k, never one in flight: each withdrawn
        (no longer listed as committed, so queued once), then its objects deleted by the purge thread."""
        flying = {os.fspath(cid).rstrip("/") for cid, future in self.in_flight if not future.done()}
        try:
            for info in committed(self.folder)[self.keep_latest_k:]:
                if info.path.rstrip("/") not in flying:
                    withdraw(info.path)
                    self.purge_queue.put(info.path)
        except OSError as e:  # the bucket unreachable now: training goes on, the next save prunes
            logger.warning("fastckpt: pruning %s failed (%s); the next save tries again", self.folder, e)

    def _close(self) -> None:
        if getattr(self, "_closed", True):  # closed already, or its __init__ never got this far
            return
        self._closed = True
        try:
            self._land(block=True)  # every save in flight lands (or raises) before its stager and writer close
            self._purge_stale_checkpoints()  # what the last saves pushed past keep_latest_k
        finally:
            super()._close()  # torchtitan's purge thread; self.stager
            self.writer.close()

