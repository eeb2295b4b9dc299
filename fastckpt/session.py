"""The front door every plugin builds on: a training's checkpoints, made from one settings object.

`TrainingSession.of(settings, keywords, pool=, distributed=)` checks what a
front end was given once (settings.given_one_way: one CheckpointerConfig or mapping, or
keywords), places the checkpoints once (settings.placed_by_path: files by path, a pool's models,
a memory tier in front; which ranks save) and builds what the plugin runs them with:
  named     NamedCheckpoints: checkpoints saved, loaded and removed by path
  saves     TrainingSaves: those saves inside the training loop, behind the optimizer-step gate
            (the plugin's own gate, made from `named`, or the Checkpointer's)
A DeepSpeed entry is placed where it is checked (`placed`), then `TrainingSession(config)`.

Beside it, the rest of what a plugin needs of the backend, by concern, so that a plugin imports
this module, fastckpt.errors and (for DCP) fastckpt.dcp, and nothing deeper
(tests/fastckpt/test_imports.py, REACH): the settings' names; preemption (PreemptSignal: the
handler notes the signal, Checkpointer.at_step_end agrees and saves); the checkpoint interval
(AutoInterval); activation offload (`activation_offload`); the layer-wise release; a folder
withdrawn wherever it is saved; DeepSpeed's tag commit (file sets, records, the agreement, the
bucket mirror); what `fastckpt ls` lists; which front ends started.
"""
from __future__ import annotations

import dataclasses
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
from .offload.settings import OffloadConfig, offload_from
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
from .training_saves import TrainingSaves
from .tune.auto_interval import AutoInterval
from .write.deadline import Deadline
from .write.gate import storages_of
from .write.layerwise import layerwise_comm_hook

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
    "is_pool_pointer", "Deadline", "Checkpointer", "NamedCheckpoints", "storages_of", "FolderMirror", "S3Place", "Remote",
    "FolderKind", "Entry",
    "front_ends",
]


def placed(settings: CheckpointerConfig | Mapping[str, Any] | None = None, keywords: Optional[dict] = None, *,
           pool: Optional[str] = None, distributed: Optional[bool] = False) -> CheckpointerConfig:
    """What a front end was given (one CheckpointerConfig or mapping, or keywords), checked once and
    placed: the path store (with a memory tier in front where the settings' `tiers` name one), or
    a pool's models (`pool`); `distributed` as the Checkpointer's (False: each process's own
    checkpoints; None: every rank saves its part)."""
    return placed_by_path(given_one_way(settings, dict(keywords or {})), pool, distributed)


def activation_offload(node: Any) -> Optional[ActivationOffload]:
    """Activation offload made from its settings (OffloadConfig's fields, unknown ones a ConfigError);
    None where they say off (None, False, enabled=False)."""
    return offload_from(node)


class TrainingSession:
    """A training's checkpoints by path, from settings already placed (`of` places them).

    Args:
        config: placed settings (`placed`, or a DeepSpeed entry's).
        own_files: each rank saves its own files alone, whatever `config.distributed` says of the
            job (DeepSpeed: a tag commits across the ranks through its own commit).
        gate: makes the plugin's optimizer-step gate from the NamedCheckpoints (None: theirs).
        scoped: the gate is called with the optimizer that steps (it may wait for that one's alone).
        pool_pointers: a pool's model leaves a pointer file at its path (DeepSpeed reads them).
    """

    def __init__(self, config: CheckpointerConfig, *, own_files: bool = False,
                 gate: Optional[Callable[[NamedCheckpoints], Callable[..., None]]] = None, scoped: bool = False,
                 pool_pointers: bool = False) -> None:
        self.config = config
        self.named = NamedCheckpoints(dataclasses.replace(config, distributed=False) if own_files else config,
                                      pool_pointers=pool_pointers)
        self.gate = gate(self.named) if gate is not None else self.named.gate
        self.saves = TrainingSaves(self.named, self.gate, scoped=scoped)

    @classmethod
    def of(cls, settings: CheckpointerConfig | Mapping[str, Any] | None = None, keywords: Optional[dict] = None, *,
           pool: Optional[str] = None, distributed: Optional[bool] = False, **how: Any) -> "TrainingSession":
        """Settings as a front end was given them, checked and placed once (`placed`), then the session."""
        return cls(placed(settings, keywords, pool=pool, distributed=distributed), **how)

    def close(self) -> None:
        """The run is over: no optimizer step reaches these saves, and every save in flight lands
        (the first write error raised, as on_error says)."""
        self.saves.end_run()
        self.named.close()
