"""A tier in front of the last (a memory tier such as /dev/shm/run7): each rank's own folder.

Layout:  TIER/rank-R/step-00000100.c000007/{rank-R.pt, COMMIT}
A node's memory is its own: on a job of several nodes the ranks of one node cannot see another
node's memory tier. So each rank keeps its part under its own folder, and commits it there
itself (commit_rank, on every rank, once every rank's part is durable somewhere): the record is
the checkpoint's whole record (every rank's file, size and CRC), checked here against this
rank's own file only. Which step every rank can get is agreed when loading
(fastckpt.restore.newest). Naming, listing and retention are the root store's.

Memory is recycled: a removed checkpoint's part file is kept aside (`.spare/`, a few at most) and
the next checkpoint's part is written into it in place (the file sink does not truncate a file it
writes: every byte up to its new size is written again, what lies beyond is cut). A new file on a
memory filesystem costs the kernel a fresh zeroed page for every page written; a recycled one
costs the copy alone. Never a checkpoint a load has mapped (its folder holds `LENT`, made before
the mapping): a private mapping shows what is later written into its file, so the loaded tensors
would change under the caller; that folder's files are deleted instead.

On a memory filesystem (tmpfs) a part is written through a mapping of its file
(fastckpt.write.host_file over the native MemoryFileSink: one copy, no staging, the CRC after it on
a writer thread); elsewhere (a node-local SSD in front of a shared disk) as any file. The process
keeps each part's mapping from one save to the next (the native memory_maps.h: the copy to the
disk reads it there, a later save recycling the file writes into it again); a deleted file's
mapping goes at the next save or room check, and every unused one when the tier is closed.
"""
from __future__ import annotations

import dataclasses
import errno
import os
import re
import shutil
from typing import Optional

from .. import _native
from ..commit import record as commit
from ..commit.committed_under import CommittedUnder
from ..commit_info import CommitInfo
from ..errors import CorruptCheckpointError
from ..format import load_file
from ..fsutil import fsync_dir
from ..write.protocol import FileSink, MemoryFileSink
from .root_store import DIR_RE, RootStore

RANK_RE = re.compile(r"^rank-(\d+)$")


def rank_folder(place: str, rank: int) -> str:
    """Where rank's parts live in the tier at place."""
    return os.path.join(os.path.abspath(os.fspath(place)), f"rank-{rank}")


SPARE = ".spare"
LENT = "LENT"  # in a checkpoint folder: a load mapped its files, which are deleted, never written over


def lend(folder: str) -> bool:
    """Before a load maps the files of a memory tier's checkpoint folder (any process's): they are
    never recycled (written over by a later save, which a private mapping would show); once
    removed, they are deleted, and the load's pages stay its own. The load then checks the folder
    is still committed (`load_lent` does both): a removal that withdrew it first may have recycled them.
    False when the folder cannot be marked (read-only to this process): the load copies instead."""
    try:
        open(os.path.join(folder, LENT), "ab").close()
        return True
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return False
        raise


def load_lent(folder: str, path: str, committed: bool = True, **how):
    """The file at path, of the memory tier's checkpoint folder, loaded (fastckpt.format.load_file,
    `how` its arguments): mapped once the folder is lent (`lend`), else copied; committed: checked
    still committed afterwards (a removal that withdrew it first may have recycled the file)."""
    if how.get("mmap") is not False and not lend(folder):
        how = dict(how, mmap=False)
    state = load_file(path, **how)
    if committed and commit.present(folder) is None:
        raise CorruptCheckpointError(f"{folder} was removed while it was read")
    return state


class NodeTier(RootStore):
    """The parts of one rank in a tier before the last; every rank commits and retains its own."""

    makes_ahead = False  # a removed part's file is recycled instead (a new one would hold memory)

    def __init__(self, place: str, rank: int, spares: int = 3):
        super().__init__(rank_folder(place, rank))
        self.place, self.rank, self.spares = os.path.abspath(os.fspath(place)), rank, spares
        self.recycled = 0  # parts written into a recycled file
        self._memory: Optional[bool] = None

    @property
    def sink_kind(self) -> str:
        """"memory" on a memory filesystem (parts written through a mapping), else "file"."""
        if self._memory is None:
            at = self.place
            while not os.path.exists(at) and os.path.dirname(at) != at:
                at = os.path.dirname(at)
            self._memory = _native.on_memory_filesystem(at)
        return "memory" if self._memory else "file"

    def sink(self, part: str, direct_io: bool):
        return MemoryFileSink(part) if self.sink_kind == "memory" else FileSink(part, direct_io)

    def begin(self, step, counter, rank, fmt, target=None, plan=None, meta=None):
        ckpt_id, part = super().begin(step, counter, rank, fmt, target, plan, meta)
        self.recycle_into(part)
        return ckpt_id, part

    def recycle_into(self, path: str) -> None:
        """A spare file (a removed part's) put at path, to be written over, when there is one. On a
        disk (a node-local SSD tier) the rename is made durable on the spares' side now (the move
        that put it there was, by remove()); the record makes the part's own folder durable before
        it is written."""
        spare = self._take_spare()
        if spare is not None:
            try:
                os.rename(spare, path)
                self.recycled += 1
            except OSError:
                return
            if self.sink_kind == "file":
                fsync_dir(os.path.dirname(spare))

    def remove(self, path: str) -> None:
        """Withdrawn first (as the root store does), its files kept aside to be written over."""
        try:
            CommittedUnder(self.root).withdraw(path)
        except OSError:
            pass
        if os.path.exists(os.path.join(path, LENT)):  # checked after the withdrawal: see lend()
            shutil.rmtree(path, ignore_errors=True)
            return
        spare_dir = os.path.join(self.root, SPARE)
        try:
            names = [n for n in os.listdir(path) if n.startswith("rank-")]
            os.makedirs(spare_dir, exist_ok=True)
            moved = 0
            for name in names:
                if len(os.listdir(spare_dir)) >= self.spares:
                    break
                os.rename(os.path.join(path, name), os.path.join(spare_dir, f"{os.path.basename(path)}.{name}"))
                moved += 1
            if moved and self.sink_kind == "file":  # on a disk: the moves durable on both sides before a
                fsync_dir(path)  # later save renames a spare into its folder (recycle_into)
                fsync_dir(spare_dir)
        except OSError:
            pass
        shutil.rmtree(path, ignore_errors=True)

    def _take_spare(self) -> Optional[str]:
        spare_dir = os.path.join(self.root, SPARE)
        try:
            names = sorted(os.listdir(spare_dir))
        except FileNotFoundError:
            return None
        return os.path.join(spare_dir, names[0]) if names else None

    def commit_rank(self, ckpt_id: str, info: CommitInfo) -> None:
        """Every rank: the checkpoint's record in its own folder (its part is durable, and so
        is every other rank's, wherever it is)."""
        commit.write(dataclasses.replace(info, path=ckpt_id))

    def commit(self, info: CommitInfo) -> None:
        """Rank 0 writes nothing more: each rank committed its own folder in commit_rank."""

    def abort(self, ckpt_id: Optional[str], file_path: Optional[str], rank: int, stuck: bool = False) -> None:
        if ckpt_id is not None:
            self.remove(ckpt_id)

    def committed(self, problems: Optional[list] = None) -> list[CommitInfo]:
        return CommittedUnder(self.root, children=lambda name: DIR_RE.match(name) is not None,
                              read=self._read).newest_first(problems)

    def _read(self, folder: str, size_of) -> CommitInfo:
        """The record of folder, its own rank's file present with the size it says."""
        info = commit.read(folder, None, None, every_rank=True)
        if size_of is not None:
            # a checkpoint of one process (named paths: fastckpt.store.named_tiers) has one part, rank 0's
            entry = info.entry_for(self.rank if info.world_size > 1 else 0)
            size = size_of(os.path.join(folder, entry.name))
            if size is None:
                raise CorruptCheckpointError(f"{folder}: file {entry.name} named by the commit record is missing")
            if size != entry.bytes:
                raise CorruptCheckpointError(f"{folder}: file {entry.name} has {size} bytes, the commit record "
                                             f"says {entry.bytes} (truncated?)")
        return info

    @classmethod
    def place_at(cls, path: str) -> Optional["NodeTier"]:
        """A rank's folder of a memory tier (TIER/rank-R holding step-N.cK folders), to read."""
        m = RANK_RE.match(os.path.basename(os.path.normpath(path)))
        if m is None or not os.path.isdir(path) or not any(DIR_RE.match(n) for n in os.listdir(path)):
            return None
        store = cls(os.path.dirname(os.path.normpath(path)), int(m.group(1)))
        store.place = path
        return store

    def _read_listed(self, path: str, seen=None) -> CommitInfo:
        """Listed: its record checked against this rank's part."""
        return self._read(path, commit.file_size)

    def close(self) -> None:
        super().close()
        _native.purge_memory_maps(True)  # mappings held for the next save: there is none

    def has_room(self, need: int, sharing: int = 1) -> bool:
        """Whether `need` bytes fit in the tier's filesystem beside what `sharing` ranks like this one
        (the ranks of this node) hold there now: its free bytes and theirs, counted as this rank's."""
        return self.free_bytes() + self.used_bytes() * sharing >= need

    def free_bytes(self) -> int:
        """Bytes the tier's filesystem can still take (for a save's memory bound)."""
        _native.purge_memory_maps()  # a deleted part still mapped holds its pages until unmapped
        st = os.statvfs(self.place if os.path.isdir(self.place) else os.path.dirname(self.place) or ".")
        return st.f_bavail * st.f_frsize

    def used_bytes(self) -> int:
        """Bytes of this rank's checkpoints there now."""
        total = 0
        for _, _, path in self._dirs():
            try:
                total += sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
            except OSError:
                continue
        return total
