"""Which DCP checkpoints of a folder a run can resume from, newest first — whoever wrote them.

A folder of DCP checkpoints (torchtitan's `step-N`, one directory per save) holds checkpoints
fastckpt committed, ones DCP's own writer wrote, saves cut short, and anything else:

  fastckpt  its commit record (`COMMIT`, fastckpt.dcp.writer) is intact and every file it
            names is there at its size
  dcp       DCP's own FileSystemWriter wrote it: its `.metadata` (written last, by the
            coordinator, once every rank's data was written) reads as DCP metadata, is not
            marked as fastckpt's, and every file it places an item in is there and reaches the
            item's end (a truncated rank file is not resumed from)
  unusable  anything else that looks like a checkpoint: no `.metadata`, fastckpt's never
            committed, a damaged record or metadata, a missing or short file (said why)

Newest is the highest step (the record's, else the number the directory's name ends with);
between equal steps, fastckpt's before DCP's, then the later commit. Item CRCs are checked when
the checkpoint is read (FastStorageReader), for DCP's files each item's own.
`newest_committed` says so in one warning when it picks a checkpoint DCP's writer made, and when
it passes over newer checkpoints it cannot use (or finds nothing usable among some): a run that
switches to fastckpt never starts again from step 0 without a word.
"""
from __future__ import annotations

import dataclasses
import os
import re
import warnings
from typing import Optional, cast

from ..commit import record
from ..commit.committed_under import CommittedUnder
from ..commit.record import plain_name
from ..commit_info import CommitInfo
from ..errors import CorruptCheckpointError, UnsafeCheckpointError
from ..settings import local_place
from ..fsutil import fsync_dir
from .check import read_metadata
from . import metadata as md_file
from .names import SUFFIX, step_of_name
from .on_s3 import S3Place, committed_at, is_s3, newest_committed_at, withdraw_at
from .stock_warning import warn_stock_once

LOOKS_LIKE = re.compile(r"^(step|checkpoint|ckpt)[-_]?\d+$")  # a checkpoint's name, even when empty
IN_FLIGHT = re.compile(r"^\..+\.fastckpt-\d+-\d+\.tmp$")  # a data file being written (fastckpt.store.path_store)
# .metadata or a record being written (fastckpt.fsutil.write_atomic's NAME.tmp.PID.TID)
ATOMIC_IN_FLIGHT = tuple(f"{n}.tmp" for n in (md_file.NAME,) + record.NAMES)


class Resumable(str):
    """A checkpoint to resume from: its directory, as a str (so `.endswith`, `json.dumps`,
    `os.path` and FastStorageReader take it as they take a path), with its step (`.step`, -1:
    neither its record nor its name says), who wrote it (`.by`: "fastckpt" or "dcp") and
    fastckpt's commit counter (`.counter`, its commit order in the folder; -1 for DCP's)."""

    step: int
    by: str
    counter: int

    def __new__(cls, path: str | os.PathLike[str], step: int, by: str, counter: int = -1) -> "Resumable":
        self = super().__new__(cls, os.fspath(path))
        self.step, self.by, self.counter = step, by, counter
        return self

    @property
    def path(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"Resumable({self.path!r}, step={self.step}, by={self.by!r})"

    def __reduce__(self) -> tuple[type[Resumable], tuple[str, int, str, int]]:
        return Resumable, (self.path, self.step, self.by, self.counter)


def committed(parent: str | os.PathLike[str]) -> list[CommitInfo]:
    """Every checkpoint fastckpt committed directly under parent, newest commit first (a damaged
    one is not one to resume from: fastckpt.commit.committed_under)."""
    if is_s3(os.fspath(parent)):
        return committed_at(S3Place.parse(os.fspath(parent).rstrip("/"), "the folder of DCP checkpoints"))
    return CommittedUnder(local_place(parent, "the folder of DCP checkpoints")).newest_first()


def is_committed(directory: str | os.PathLike[str]) -> bool:
    """Whether fastckpt committed the checkpoint in `directory`: its record reads and every file
    it names is there at its size."""
    try:
        record.read(os.fspath(directory), every_rank=False)
    except (OSError, CorruptCheckpointError):
        return False
    return True


def only_save_files(names: list[str]) -> bool:
    """Whether a folder holds nothing but what a DCP save writes (its data files, .metadata and
    their files in flight): one that holds anything else is never removed as a save cut short."""
    return all(n.endswith(SUFFIX) or n == md_file.NAME or n.startswith(ATOMIC_IN_FLIGHT) or IN_FLIGHT.match(n)
               for n in names)


@dataclasses.dataclass(frozen=True)
class Unusable:
    """A directory that looks like a checkpoint and cannot be resumed from: why; whether it is a
    save never completed (rather than a damaged one); whether it holds only what a save writes."""
    path: str
    why: str
    incomplete: bool = False
    only_save_files: bool = False

    @property
    def cut_short(self) -> bool:
        """A save that never completed and holds nothing else: safe to remove."""
        return self.incomplete and self.only_save_files


def examine(directory: str) -> Resumable | Unusable | None:
    """A Resumable, an Unusable, or None when directory does not look like a checkpoint at all."""
    found = _examine(directory)
    if isinstance(found, tuple):
        return Unusable(directory, *found)
    return found


def _examine(directory: str) -> Resumable | tuple[str, bool, bool] | None:
    name = os.path.basename(os.path.normpath(directory))
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    record_name = record.name_in(names)
    if record_name is not None:
        try:
            info = record.read(directory, record_name, every_rank=False)
        except (OSError, CorruptCheckpointError) as e:
            return f"not as its commit record says ({e})", False, False
        return Resumable(directory, info.step if info.step >= 0 else step_of_name(name), "fastckpt", info.counter)
    if md_file.NAME not in names:
        if not any(n.endswith(SUFFIX) for n in names) and not (LOOKS_LIKE.match(name) and not names):
            return None  # nothing of a DCP save here (a folder named like one, holding other things)
        return f"no {md_file.NAME}: a save cut short", True, only_save_files(names)
    meta_path = os.path.join(directory, md_file.NAME)
    try:
        metadata = read_metadata(directory)
    except (OSError, CorruptCheckpointError, UnsafeCheckpointError) as e:
        return f"unreadable {md_file.NAME} ({e})", False, False
    if md_file.written_by_fastckpt(metadata):
        return "fastckpt began it and never committed it (no commit record)", True, only_save_files(names)
    ends: dict[str, int] = {}
    try:
        for info in (metadata.storage_data or {}).values():
            file = plain_name(getattr(info, "relative_path", None), meta_path)
            ends[file] = max(ends.get(file, 0), int(info.offset) + int(info.length))
    except (CorruptCheckpointError, TypeError, ValueError) as e:
        return f"{md_file.NAME} places items where no file of the checkpoint is ({e})", False, False
    for file, end in sorted(ends.items()):
        try:
            size = os.path.getsize(os.path.join(directory, file))
        except OSError:
            return f"{file} is missing", False, False
        if size < end:
            return f"{file} has {size} bytes, its items reach byte {end} (truncated?)", False, False
    return Resumable(directory, step_of_name(name), "dcp")


def resumable(parent: str | os.PathLike[str]) -> tuple[list[Resumable], list[Unusable]]:
    """(every checkpoint under parent a run can resume from, newest first; the ones that look
    like checkpoints and cannot be resumed from)."""
    parent = local_place(parent, "the folder of DCP checkpoints")
    usable, unusable = [], []
    for name in sorted(os.listdir(parent)) if os.path.isdir(parent) else []:
        directory = os.path.join(parent, name)
        if not os.path.isdir(directory):
            continue
        found = examine(directory)
        if isinstance(found, Resumable):
            usable.append(found)
        elif found is not None:
            unusable.append(found)
    usable.sort(key=lambda r: (r.step, r.by == "fastckpt", r.counter), reverse=True)
    return usable, unusable


def cut_short_below(found: tuple[list[Resumable], list[Unusable]]) -> list[str]:
    """Of a folder's resumable() result, the folders of saves cut short whose step is below the
    newest checkpoint's: nobody writes them any more (a run's saves are committed in order, so
    every save before a committed one has ended, on every rank), and they are never resumed from."""
    usable, unusable = found
    if not usable or usable[0].step < 0:
        return []
    return [u.path for u in unusable if u.cut_short and 0 <= step_of_name(os.path.basename(u.path)) < usable[0].step]


def withdraw(directory: str) -> None:
    """A checkpoint stops looking like one, durably: its record (withdrawn as every committed
    checkpoint is: fastckpt.commit.committed_under), then its .metadata (each removal made
    durable before the next), so a removal or a save cut short after this is never taken for it
    by our reader or DCP's. A directory removed meanwhile (torchtitan's purge thread) is
    withdrawn too. At an s3:// URL: its record object, then its .metadata, deleted."""
    if is_s3(os.fspath(directory)):
        return withdraw_at(os.fspath(directory))
    CommittedUnder(os.path.dirname(os.path.abspath(directory))).withdraw(directory)
    try:
        os.unlink(os.path.join(directory, md_file.NAME))
        fsync_dir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return


def newest_committed(parent: str | os.PathLike[str], warn: bool = True) -> Optional[Resumable]:
    """The newest checkpoint under parent a run can resume from (its .path, .step, .by; it is
    os.PathLike, so FastStorageReader takes it as it is), or None when there is none.
    warn: one warning when the one picked was written by DCP's own writer, and one naming the
    checkpoints newer than it (or, when none is usable, all) that cannot be resumed from."""
    if is_s3(os.fspath(parent)):  # an object store: only what fastckpt committed there
        found = cast(Optional[tuple[str, int, int]], newest_committed_at(os.fspath(parent)))  # (URL, step, counter)
        return Resumable(*found[:2], "fastckpt", found[2]) if found is not None else None
    usable, unusable = resumable(parent)
    newest = usable[0] if usable else None
    if not warn:
        return newest
    passed = [u for u in unusable if newest is None or step_of_name(os.path.basename(u.path)) > newest.step]
    if passed:
        listed = "; ".join(f"{os.path.basename(u.path)}: {u.why}" for u in passed)
        outcome = (f"resuming from {newest.path} (step {newest.step})" if newest is not None
                   else "none can be resumed from: nothing is loaded")
        warnings.warn(f"fastckpt: {len(passed)} checkpoint(s) under {os.fspath(parent)} cannot be used ({listed}); "
                      f"{outcome}", stacklevel=2)
    if newest is not None and newest.by == "dcp":
        warn_stock_once(newest.path, f"fastckpt: resuming from {newest.path} (step {newest.step}), written by "
                        "DCP's own writer: it has no fastckpt commit record; its files' sizes were checked, each "
                        "item's CRC-32 is checked as it loads", stacklevel=3)
    return newest

