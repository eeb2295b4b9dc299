"""The front door every plugin builds on: a training's checkpoints, made from one settings object.

`placed(settings, keywords, pool=, distributed=)` checks what a front end was given once
(settings.given_one_way: one CheckpointerConfig or mapping, or keywords) and places the
checkpoints once (settings.placed_by_path: files by path, behind a memory tier where the
settings' `tiers` name one, or a pool's models; which ranks save); `TrainingSession(config)` is
then the session: its checkpoints named by path (`named`, NamedCheckpoints) saved from inside the
training loop. A DeepSpeed entry is placed where it is checked, by the same `placed`.

The part of a save that depends on training going on around it is the session's. Before any
optimizer step nothing changes the state, so a save is durable when it returns. Once steps run,
a save copies at once every tensor the optimizer update does not write and leaves the update's
own tensors to the background copy; the next update waits for those copies (write.gate.StepGate
calls the plugin's gate, `before_update`, first). Until the run has shown that nothing else
writes those tensors between a save and the next step (write.watch), a save waits for its copy
before returning. At the second step (optimizer state exists by then) staging is faulted in for
the first save, in the background, by the front end in use last (StepGate.newest), unless it was
last used by a save outside any run (reserve_ahead): steps it sees then may be another trainer's,
and nothing would free what it reserved. Layer-wise, a save's copies of the update's tensors are
held until each DDP bucket is final (write.layerwise). During a run a removed file's blocks are
freed off the training thread; nothing of this outlives end_run().

Beside it, the rest of what a plugin needs of the backend, by concern, so that a plugin imports
this module, fastckpt.errors and (for DCP) fastckpt.dcp, and nothing deeper
(tests/fastckpt/test_imports.py, REACH): the settings' names; preemption (PreemptSignal: its
at_step_end agrees, saves and exits); the checkpoint interval (AutoInterval); activation offload
(`activation_offload`); the layer-wise release; a folder withdrawn wherever it is saved;
DeepSpeed's tag commit (file sets, records, the agreement, the bucket mirror); what `fastckpt ls`
lists; which front ends started.
"""
from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Optional

from . import front_ends
from .checkpointer import Checkpointer
from .commit import record
from .commit.agreement import Agreement, make_agreement
from .commit.committed_under import CommittedUnder
from .commit.file_sets import FileSets, withdraw_anywhere
from .commit.record import file_size
from .commit_info import CommitInfo, FileEntry
from .fsutil import fsync_dir, makedirs_durable, read_regular, write_atomic
from .named import NamedCheckpoints
from .offload import ActivationOffload
from .offload.settings import OffloadConfig
from .offload.settings import offload_from as activation_offload  # None where its settings say off
from .pending import Pending
from .pmem.pointer import is_pool_pointer
from .preempt import PreemptSignal, signal_number
from .save_load import load, save
from .settings import (BY_PATH, DEFAULTS, PLACEMENT, URL, WRITING, CheckpointerConfig, flatten, given_one_way,
                       placed_by_path)
from .store.s3.folder_mirror import FolderMirror
from .store.s3.place import S3Place
from .store.url_files import Remote
from .tools.folder_kinds import FolderKind
from .tools.folders import Entry
from .tune.auto_interval import AutoInterval
from .write.deadline import Deadline
from .write.gate import StepGate, storages_of
from .write.layerwise import HeldSnapshots, layerwise_comm_hook

__all__ = [
    "TrainingSession", "placed", "activation_offload",
    # settings
    "BY_PATH", "CheckpointerConfig", "DEFAULTS", "PLACEMENT", "URL", "WRITING", "flatten",
    # preemption, the interval, offload, layer-wise
    "PreemptSignal", "signal_number", "AutoInterval", "ActivationOffload", "OffloadConfig",
    "layerwise_comm_hook",
    # files and folders
    "save", "load", "fsync_dir", "makedirs_durable", "read_regular", "write_atomic", "withdraw_anywhere",
    # DeepSpeed's tags: committed as file sets, read back, mirrored to a bucket, listed
    "Agreement", "make_agreement", "CommittedUnder", "FileSets", "record", "file_size", "CommitInfo", "FileEntry",
    "is_pool_pointer", "Deadline", "Checkpointer", "NamedCheckpoints", "storages_of", "FolderMirror", "S3Place",
    "Remote", "FolderKind", "Entry",
    "front_ends",
]


def placed(settings: CheckpointerConfig | Mapping[str, Any] | None = None, keywords: Optional[dict] = None, *,
           pool: Optional[str] = None, distributed: Optional[bool] = False) -> CheckpointerConfig:
    """What a front end was given (one CheckpointerConfig or mapping, or keywords), checked once and
    placed: the path store (with a memory tier in front where the settings' `tiers` name one), or
    a pool's models (`pool`); `distributed` as the Checkpointer's (False: each process's own
    checkpoints; None: every rank saves its part)."""
    return placed_by_path(given_one_way(settings, dict(keywords or {})), pool=pool, distributed=distributed)


class TrainingSession:
    """A training's checkpoints by path, from settings already placed (`placed` places them).

    Args:
        config: placed settings (`placed`, or a DeepSpeed entry's).
        own_files: each rank saves its own files alone, whatever `config.distributed` says of the
            job (DeepSpeed: a tag commits across the ranks through its own commit).
        gate: makes the plugin's own gate from the NamedCheckpoints (None: theirs), called before
            every optimizer update (with the optimizer when scoped=True: it may wait only for what
            that step writes).
        pool_pointers: a pool's model leaves a pointer file at its path (DeepSpeed reads them).
    """

    def __init__(self, config: CheckpointerConfig, *, own_files: bool = False,
                 gate: Optional[Callable[[NamedCheckpoints], Callable[..., None]]] = None, scoped: bool = False,
                 pool_pointers: bool = False) -> None:
        self.config = config
        self.named = NamedCheckpoints(dataclasses.replace(config, distributed=False) if own_files else config,
                                      pool_pointers=pool_pointers)
        self.before_update = gate(self.named) if gate is not None else self.named.gate
        self.gate = StepGate(self._gate, scoped=scoped)
        self.gate.install()
        self.held = HeldSnapshots(self.gate)
        self.active = False  # from the first save or update of a run to end_run()
        # off while the gate was armed again by a save outside any run (trainer.save_checkpoint
        # after fit): see the module's docstring
        self.reserve_ahead = True
        self.synchronous = False  # the caller saves off the training thread: nothing left behind
        self._freer: Optional[ThreadPoolExecutor] = None
        self.named.free = self._free

    @property
    def running(self) -> bool:
        """An optimizer step has run since the start (or the last end_run)."""
        return self.gate.steps_seen > 0

    def save(self, state: Any, path: str, step: int, held: bool = False,
             also_owned: frozenset = frozenset()) -> Pending:
        """One checkpoint of `state` at `path`. held: layer-wise, the update's own tensors are
        copied bucket by bucket as `held` releases them (not before any step, nor while the
        save must copy before returning). also_owned: storages that only the update writes
        beyond the optimizers' own."""
        self.active = self.active or self.running
        view = self.gate.snapshot_view(state, also_owned)
        held = held and self.running and not view.copy_now
        pending = self.named.save(view.state, path, step=step, held=held, watch=view.watch)
        if held and not pending.skipped:
            self.held.hold(pending, view.owned)
        if not self.running:
            pending.wait()
        elif view.copy_now:
            pending.release_all()
            pending.wait_copied()
        return pending

    def _gate(self, *optimizer: Any) -> None:
        self.active = True
        self.held.clear()  # whatever a bucket did not release goes now
        self.before_update(*optimizer)
        if self.gate.steps_seen == 2 and self.reserve_ahead and self.gate.newest():
            self.named.reserve(self.gate.owned_bytes(), self.gate.owned_device())

    def _free(self, job: Callable[[], None]) -> None:
        """Frees a removed file's blocks: off the training thread during a run (joined at
        end_run), otherwise at once."""
        if not self.active or self.synchronous:
            job()
            return
        if self._freer is None:
            self._freer = ThreadPoolExecutor(1, thread_name_prefix="fastckpt-remove")
        self._freer.submit(job)

    def end_run(self) -> None:
        """No optimizer step of anyone reaches these saves any more, frees in flight are done;
        a next run starts afresh."""
        self.held.clear()
        self.gate.remove()
        self.gate.steps_seen = 0
        self.gate.trust.reset()
        self.active = False
        freer, self._freer = self._freer, None
        if freer is not None:
            freer.shutdown(wait=True)
