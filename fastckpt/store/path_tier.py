"""The caller's path as the tier behind a memory copy of a named checkpoint (PathTier, as
fastckpt.commit.persist_unit sees a tier), and the index of what each path holds.

The index: one small file per path in a rank's memory folder (`.persisted/`, its name the path's
hash), listing the last NOTES saves copied to that path — each one's commit time and counter and
the file it became (inode, size, modification time), noted just before the rename that puts it
there (a rename keeps all three): `read_notes` and `matches` tell which save a file is.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from typing import Callable, Optional

from ..commit_info import CommitInfo
from ..fsutil import fsync_dir
from .tier_copy import copy_part

def stamp(path: str) -> Optional[dict]:
    """What identifies the file at path now (None: there is none)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return {"dev": st.st_dev, "ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def note_name(path: str) -> str:
    """The index file of a path (its name hashed: any path, one flat folder)."""
    return hashlib.sha1(path.encode("utf-8", "surrogateescape")).hexdigest()


def matches(note: Optional[dict], now: Optional[dict]) -> bool:
    """Whether an index note is the file whose stamp is `now`."""
    return note is not None and now is not None and {k: note.get(k) for k in now} == now


NOTES = 8  # saves an index file remembers per path


def read_notes(index_file: str, path: str) -> list[dict]:
    """The saves an index file notes for path (none when it is missing, unreadable or another's)."""
    raw = read_small(index_file)
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        return []
    if not isinstance(body, dict) or body.get("path") != path or not isinstance(body.get("saves"), list):
        return []
    return [n for n in body["saves"] if isinstance(n, dict)]


def read_small(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(1 << 16)
    except (OSError, UnicodeDecodeError):
        return None


class PathTier:
    """The caller's path as the tier behind one memory copy, as PersistCommit sees a tier: the part
    is copied into a hidden sibling folder, renamed over the path once durable (its folder
    fsync'ed), and the memory folder's index notes which save the path now holds. place(target,
    land): land() run unless the path was removed meanwhile (False then), under its owner's lock."""

    def __init__(self, target: str, index: str, place: Callable[[str, Callable[[], None]], bool]):
        self.target, self.index, self._place = target, index, place
        self.root = target
        self._made: list[str] = []

    def new_dir(self, step: int, counter: int) -> str:
        parent, name = os.path.split(self.target)
        # swept if we die: by the next save of a path in this folder (fastckpt.store.path_store.sweep_dead_tmp)
        folder = os.path.join(parent, f".{name}.fastckpt-{os.getpid()}-{counter}.tmp")
        os.makedirs(folder, exist_ok=True)
        self._made.append(folder)
        return folder

    @staticmethod
    def put_copy(src: str, folder: str, entry, direct_io: bool = True) -> None:
        """One memory copy made durable in the folder beside its path, checked first (renamed over it in commit_rank)."""
        copy_part(src, os.path.join(folder, entry.name), entry, direct_io)

    def commit_rank(self, folder: str, info: CommitInfo) -> None:
        part = os.path.join(folder, info.files[0].name)
        # noted before the rename (the rename keeps the file's inode, size and mtime): a kill in
        # between leaves a note no file matches, beside the older ones, one of which still does
        made = stamp(part)
        if made is not None:
            self._note(dict(made, time=info.time, counter=info.counter))
        if not self._place(self.target, lambda: os.replace(part, self.target)):  # removed by its owner while
            # being copied: nothing lands
            shutil.rmtree(folder, ignore_errors=True)
            return
        # the rename durable: both its folders synced after it (the hidden one it left, and the path's)
        fsync_dir(folder)
        fsync_dir(os.path.dirname(self.target))
        shutil.rmtree(folder, ignore_errors=True)

    def _note(self, save: dict) -> None:
        """The path's index file: its last NOTES saves copied there, newest last."""
        os.makedirs(self.index, exist_ok=True)
        path = os.path.join(self.index, note_name(self.target))
        saves = read_notes(path, self.target)[-(NOTES - 1):] + [save]
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump({"path": self.target, "saves": saves}, f)
        os.replace(path + ".tmp", path)

    def commit(self, info: CommitInfo) -> None:
        """Nothing more: the rename made it the path's."""

    def abort(self, folder, part, rank: int, stuck: bool = False) -> None:
        for made in self._made:
            shutil.rmtree(made, ignore_errors=True)
