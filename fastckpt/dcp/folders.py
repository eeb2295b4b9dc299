"""PyTorch DCP checkpoints as `fastckpt ls`, `verify` and `export` read them: a folder of DCP
checkpoints (torchtitan's `step-N`, one directory per save) and one of them — a FolderKind
(fastckpt.tools.folder_kinds), named in setup.cfg's entry points `fastckpt.folders`.

Status of one DCP checkpoint directory:
  committed   fastckpt's commit record (COMMIT) is intact and names every file at its size
  foreign     DCP's own FileSystemWriter wrote it (`.metadata`, no record): loadable, no file CRCs
  incomplete  fastckpt began it and never committed it (its `.metadata` is marked as ours, no
              record), or there is no `.metadata` at all: a save cut short, never loaded
  invalid     the record is damaged or disagrees with the files
`export` reads the whole, consolidated state (every rank's shards; resharding is DCP's planner's)
through FastStorageReader, every item's CRC checked.
"""
from __future__ import annotations

import os
from typing import Optional

from ..commit import record
from ..errors import CorruptCheckpointError, NoCheckpointError
from ..tools.folder_kinds import FolderKind
from ..tools.folders import Entry
from . import metadata as md_file
from .check import check_file
from .committed import Resumable, examine, resumable
from .names import SUFFIX, step_of_name



class DcpFolders(FolderKind):
    many, one = "dcp", "dcp-checkpoint"
    describe = {"dcp": "a folder of PyTorch DCP checkpoints", "dcp-checkpoint": "one PyTorch DCP checkpoint"}

    def is_one(self, path: str, names: list[str]) -> bool:
        return md_file.NAME in names or any(n.endswith(SUFFIX) for n in names)

    def latest(self, path: str) -> Optional[str]:
        return None  # DCP keeps no pointer; the newest committed is fastckpt.dcp.newest_committed's

    def entry(self, parent: str, name: str, latest: Optional[str]) -> Entry:
        directory = os.path.join(parent, name)
        entry = Entry(name, directory, "incomplete", time=os.path.getmtime(directory),
                      step=step_of_name(name) if step_of_name(name) >= 0 else None)
        names = os.listdir(directory)
        data = sorted(n for n in names if n.endswith(SUFFIX))
        record_name = record.name_in(names)
        if record_name is not None:
            try:
                info = record.read(directory, record_name, every_rank=False)
            except (CorruptCheckpointError, OSError) as e:
                entry.status, entry.detail = "invalid", str(e)
                return entry
            ranks = f"{info.world_size} rank{'s' if info.world_size > 1 else ''}"
            entry.status, entry.detail, entry.bytes = "committed", f"DCP, {ranks}, by fastckpt", info.bytes
            entry.step = info.step if info.step >= 0 else entry.step
            entry.checks = [(os.path.join(directory, f.name), f) for f in info.files]
            return entry
        found = examine(directory)
        if not isinstance(found, Resumable):  # a save never completed ("incomplete"), or damage
            entry.status = "incomplete" if found is None or found.incomplete else "invalid"
            entry.detail = found.why if found is not None else f"no {md_file.NAME}: a save cut short"
            return entry
        entry.status, entry.detail = "foreign", "DCP, by its own writer: no fastckpt record"
        entry.checks = [(os.path.join(directory, n), None) for n in [md_file.NAME] + data]
        entry.bytes = sum(os.path.getsize(p) for p, _ in entry.checks)
        return entry

    def check(self, path: str, entry) -> str:
        return check_file(path, entry)

    def full_state(self, path: str, step: Optional[int] = None):
        """(the state, which checkpoint it is): one DCP checkpoint, or from a folder of them the
        newest committed (or the one of `step`)."""
        directory = path if self.is_one(path, os.listdir(path)) else _pick(self, path, step)
        from torch.distributed.checkpoint import default_planner, state_dict_loader

        from .reader import FastStorageReader
        state: dict = {}
        # DCP's own conversion to one file (format_utils.dcp_to_torch_save) loads this way, through
        # two names DCP keeps private: the planner that builds the state from .metadata alone
        state_dict_loader._load_state_dict(state, storage_reader=FastStorageReader(directory),
                                           planner=default_planner._EmptyStateDictLoadPlanner(), no_dist=True)
        return state, directory


def _pick(kind: DcpFolders, parent: str, step: Optional[int]) -> str:
    """The newest checkpoint a run would resume from (committed.resumable's order), or step's."""
    usable = [r for r in resumable(parent)[0] if step is None or r.step == step]
    if not usable:
        which = f"of step {step} " if step is not None else ""
        raise NoCheckpointError(f"no committed DCP checkpoint {which}under {parent}")
    return usable[0].path
