"""The checkpoints committed directly under one parent folder: newest first, the next counter, withdrawal.

A parent folder holds one checkpoint per child folder, each made real by its commit record,
`COMMIT` (a DeepSpeed tag of fastckpt 0.1 may hold `fastckpt-tag.json` instead: only DeepSpeed's
`read` takes that one, deepspeed_fastckpt.tag_records): the Checkpointer's
root (each step-N.cK), DeepSpeed's save_dir (each tag), a DCP folder (each step-N). Every
front end asks the same three things of such a parent, answered here once:
- which children are committed, newest (highest commit counter) first — a child without the
  record is not one (quietly), one whose record is damaged or disagrees with its files is
  passed over and said why (`problems`);
- which counter the next commit under the parent takes: one past the highest of any record
  there, its files unchecked (a commit never reuses a counter, even of a damaged checkpoint);
- withdrawing a child before its files are removed or written over: its record goes first,
  durably, so a crash part-way leaves a folder no reader takes for a checkpoint, never a
  record naming files that are gone.
`read` reads one child's record (default: fastckpt.commit.record.read; DeepSpeed's also reads
the tag records fastckpt 0.1 wrote), `size_of` sizes the files it names, `children` picks the
candidates by name (default: every child folder).
"""
from __future__ import annotations

import os
from typing import Callable, Optional

from ..commit_info import CommitInfo
from ..errors import CorruptCheckpointError
from ..fsutil import fsync_dir
from . import record
from .record import file_size

SizeOf = Callable[[str], Optional[int]]


class CommittedUnder:
    """The checkpoints committed under `parent`."""

    def __init__(self, parent, *, size_of: Optional[SizeOf] = file_size, every_rank: bool = False,
                 children: Optional[Callable[[str], bool]] = None,
                 read: Optional[Callable[[str, Optional[SizeOf]], CommitInfo]] = None):
        self.parent = os.fspath(parent)
        self.size_of, self.every_rank, self._pick = size_of, every_rank, children
        self._read = read or (lambda folder, size_of: record.read(folder, None, size_of, every_rank=every_rank))

    def children(self) -> list[str]:
        """The child folders that may hold a checkpoint (their paths)."""
        try:
            names = os.listdir(self.parent)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [os.path.join(self.parent, n) for n in names if self._pick is None or self._pick(n)]

    def newest_first(self, problems: Optional[list] = None) -> list[CommitInfo]:
        """Every committed checkpoint here, newest commit first; why a child with a record was
        passed over is appended to problems."""
        found = []
        for folder in self.children():
            if record.present(folder) is None:
                continue  # never committed (or gone since the listing): not a checkpoint here
            try:
                found.append(self._read(folder, self.size_of))
            except FileNotFoundError:
                continue  # removed since the listing (retention): gone, not damaged
            except (CorruptCheckpointError, OSError) as e:
                if problems is not None:
                    problems.append(str(e))  # names the checkpoint's folder
        return sorted(found, key=lambda info: info.counter, reverse=True)

    def newest(self) -> Optional[CommitInfo]:
        """The newest committed checkpoint here, or None."""
        found = self.newest_first()
        return found[0] if found else None

    def next_counter(self) -> int:
        """The counter the next commit here takes: one past the highest record's (1: none)."""
        newest = 0
        for folder in self.children():
            try:
                newest = max(newest, self._read(folder, None).counter)
            except (OSError, CorruptCheckpointError):
                continue
        return newest + 1

    def withdraw(self, child) -> None:
        """child (a folder here) stops being a committed checkpoint, durably: every record name
        it has is removed, each removal made durable before this returns (its files stay: the
        caller's to remove or write over). A child removed meanwhile (a remover thread) is
        withdrawn too: nothing of it is left to take for a checkpoint."""
        child = os.fspath(child)
        for name in record.NAMES:
            try:
                os.unlink(os.path.join(child, name))
                fsync_dir(child)
            except (FileNotFoundError, NotADirectoryError):
                continue
