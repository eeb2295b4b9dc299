"""DCP checkpoints saved into directories a caller names, saved into again and removed by the
caller — never losing the last good one. What a front end that names its checkpoints by path
(Lightning's ModelCheckpoint through FastModelParallelStrategy, a plain loop) calls around
`dcp.async_save`; the ranks' agreement (who saw which save finish) is the caller's, this class
only keeps the books and does the coordinator's file work.

- Saving into a directory that holds a committed checkpoint (ModelCheckpoint's `last.ckpt`,
  saved into again and again) never withdraws it while the new one is written: `prepare`
  returns a hidden sibling to write into, and `land` swaps it in once committed (two renames;
  a crash between them is finished by `recover`, which the next save or load of that path
  runs first). Anything else is prepared in place, withdrawn first (its record, then its
  `.metadata`, each durably: fastckpt.dcp.committed.withdraw).
- Removing (`remove`) a directory still being written, or one removed before a checkpoint saved
  after it was issued is committed, is deferred: `remove_due` deletes what may go (withdrawn
  first, so a removal cut short is never taken for a checkpoint).
Every call that touches files is the coordinator's (`coordinator=True`); the others keep the
same books so that every rank lands and raises alike.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Optional

from ..fsutil import fsync_dir
from .committed import is_committed, withdraw

NEW, OLD = ".fastckpt-new", ".fastckpt-old"  # beside a committed directory saved into again


def beside(path: Path, suffix: str) -> Path:
    return path.parent / f".{path.name}{suffix}"


class SavedPaths:
    """The DCP saves of one writer into paths, in flight and landed, and their deferred removals."""

    def __init__(self, coordinator: bool):
        self.coordinator = coordinator
        self._saving: dict[str, tuple[int, Any, Path]] = {}  # path -> (save number, DCP's response, written into)
        self._saves = 0
        self._committed = -1  # the number of the newest save known committed
        self._deferred: list[tuple[str, int]] = []  # (path, the saves issued before its removal)

    # -- saving ------------------------------------------------------------
    def prepare(self, path: str | os.PathLike[str]) -> Path:
        """Where the next save into `path` is written (the coordinator decides; the caller hands
        that to the other ranks). Its previous save must have landed (land())."""
        path = Path(path)
        self._deferred = [(k, n) for k, n in self._deferred if k != str(path)]  # saved again: not removed
        if not self.coordinator:
            return path
        recover(path)
        if path.is_dir() and is_committed(path):
            into = beside(path, NEW)
            shutil.rmtree(into, ignore_errors=True)
            into.mkdir()
            fsync_dir(str(path.parent))
            return into
        if path.is_file():
            path.unlink()
        path.mkdir(parents=True, exist_ok=True)
        withdraw(str(path))
        return path

    def issued(self, path: str | os.PathLike[str], into: str | os.PathLike[str], response: Any) -> None:
        """The save into `path` (written into `into`) was issued: `response` is DCP's AsyncSaveResponse."""
        self._saving[str(Path(path))] = (self._saves, response, Path(into))
        self._saves += 1

    def finished(self) -> list[str]:
        """The paths whose save in flight has finished (what this rank sees: the caller agrees)."""
        return [key for key, (_, response, _) in self._saving.items() if response.upload_completion.done()]

    def in_flight(self) -> list[str]:
        return list(self._saving)

    def land(self, path: str | os.PathLike[str]) -> None:
        """Waits for the save into `path` (if one is in flight) and raises its error; a save
        committed beside the old checkpoint takes its place."""
        key = str(Path(path))
        entry = self._saving.pop(key, None)
        if entry is None:
            return
        number, response, into = entry
        response.upload_completion.result()
        if self.coordinator and str(into) != key:
            swap_in(Path(key), into)
        self._committed = max(self._committed, number)

    # -- removing ----------------------------------------------------------
    def remove(self, path: str | os.PathLike[str]) -> None:
        """The caller no longer keeps `path`: deleted now if it may go, else once it may (never blocks)."""
        if self.coordinator:
            self._deferred.append((str(Path(path)), self._saves))
        self.remove_due()

    def remove_due(self) -> None:
        """Deletes each removed path that is not being written and whose removal came before a
        save that is now committed (the coordinator; after land() of what finished)."""
        if not self.coordinator:
            return
        still = []
        for key, issued in self._deferred:
            if key in self._saving or self._committed < issued - 1 or self._committed < 0:
                still.append((key, issued))
            elif os.path.isdir(key):
                withdraw(key)  # no longer a checkpoint before its files go
                shutil.rmtree(key, ignore_errors=True)
            elif os.path.exists(key):
                os.remove(key)
        self._deferred = still


def swap_in(path: Path, new: Path) -> None:
    """The committed `new` takes `path`'s place; the old one goes. A crash in between leaves both
    hidden siblings, which recover() sorts out."""
    old = beside(path, OLD)
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        os.rename(path, old)
    os.rename(new, path)
    fsync_dir(str(path.parent))
    shutil.rmtree(old, ignore_errors=True)


def recover(path: str | os.PathLike[str]) -> Optional[Path]:
    """Finishes what a crash cut short around `path` (the coordinator, with no save into it in
    flight): a committed new sibling whose swap did not happen takes the place; an old one whose
    place is empty goes back; leftovers go. Returns what took the place, if anything did."""
    path = Path(path)
    new, old = beside(path, NEW), beside(path, OLD)
    back = None
    if not path.exists():
        back = new if new.is_dir() and is_committed(new) else old if old.is_dir() and is_committed(old) else None
        if back is not None:
            os.rename(back, path)
            fsync_dir(str(path.parent))
    for leftover in (new, old):
        if leftover.exists():
            shutil.rmtree(leftover, ignore_errors=True)
    return back
