"""The local spool of an object store: where a part is written before it is uploaded, and where a
part is downloaded before it is loaded (the file formats are read from files).

On a memory filesystem (/dev/shm) when there is room: a part is then written through a mapping of
its file (the write path's MemoryFileSink: the copy the gate waits for is the only one) and the
upload reads it from memory. Otherwise a folder of the system's temporary directory on disk. Each
store's spool is a folder of its own, named by its pid, removed at close; folders of dead
processes are swept when a new one is made.

Memory is recycled: an uploaded part's file is kept aside (`.spare/`, SPARES at most) and the next
part is written over it, so its pages are not faulted in again at every save (on tmpfs that is
most of what the copy training waits for costs).
"""
from __future__ import annotations

import os
import shutil
import tempfile

from ... import _native
from ..path_store import pid_alive

PREFIX = "fastckpt-s3-"
MEMORY = "/dev/shm"
SPARE = ".spare"
SPARES = 2  # uploaded parts' files kept to be written over


def room(folder: str) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


class Spool:
    """A folder of this process for parts on their way to or from the object store."""

    def __init__(self):
        self.folder = None
        self.memory = False
        self._earlier: list[str] = []  # folders left for disk: removed at close (parts may still be in them)
        self._disk = None  # a folder on disk for files the memory filesystem has no room for

    def open(self, on_memory: bool = True) -> str:
        """The folder, made on first use: on the memory filesystem when asked and there is one."""
        if self.folder is None:
            base = MEMORY if on_memory and os.path.isdir(MEMORY) and os.access(MEMORY, os.W_OK) else tempfile.gettempdir()
            _sweep(base)
            self.folder = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=base)
            self.memory = bool(_native.on_memory_filesystem(self.folder))
        return self.folder

    def path(self, name: str) -> str:
        return os.path.join(self.open(), name)

    def room(self) -> int:
        """Free bytes, the spares' counted in (they are written over, never added to)."""
        _native.purge_memory_maps()  # a deleted part still mapped holds its pages until unmapped
        return room(self.open()) + sum(os.path.getsize(p) for p in self._spares())

    def _spares(self) -> list[str]:
        """The files kept aside to be written over, oldest name first."""
        folder = os.path.join(self.open(), SPARE)
        try:
            return [os.path.join(folder, n) for n in sorted(os.listdir(folder))]
        except FileNotFoundError:
            return []

    def keep(self, path: str) -> None:
        """A part's file, uploaded: kept aside to be written over (on memory, SPARES at most), else removed."""
        try:
            if self.memory and path.startswith(self.folder + os.sep) and len(self._spares()) < SPARES:
                os.makedirs(os.path.join(self.folder, SPARE), exist_ok=True)
                os.rename(path, os.path.join(self.folder, SPARE, os.path.basename(path)))
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass

    def reuse_into(self, path: str) -> None:
        """A spare file put at path, to be written over, when there is one."""
        for spare in self._spares():
            try:
                os.rename(spare, path)
                return
            except OSError:
                continue

    def folder_for(self, nbytes: int) -> str:
        """Where a file of nbytes goes now: the spool's folder when it has room for it (and a
        margin), else a folder of the system's temporary directory on disk (a small /dev/shm)."""
        folder = self.open()
        if room(folder) >= nbytes + (64 << 20):
            return folder
        if self._disk is None:
            self._disk = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=tempfile.gettempdir())
        return self._disk

    def to_disk(self) -> None:
        """Later parts spooled on disk (the memory filesystem is too small)."""
        if self.memory:
            shutil.rmtree(os.path.join(self.folder, SPARE), ignore_errors=True)  # memory it is short of
            self._earlier.append(self.folder)
            self.folder, self.memory = None, False
            self.open(on_memory=False)

    def close(self) -> None:
        for folder in self._earlier + [f for f in (self.folder, self._disk) if f is not None]:
            shutil.rmtree(folder, ignore_errors=True)
        self.folder, self.memory, self._earlier, self._disk = None, False, [], None


def _sweep(base: str) -> None:
    """Spool folders of processes that are gone, removed."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for n in names:
        if n.startswith(PREFIX):
            try:
                pid = int(n[len(PREFIX):].split("-")[0])
            except ValueError:
                continue
            if pid != os.getpid() and not pid_alive(pid):
                shutil.rmtree(os.path.join(base, n), ignore_errors=True)
