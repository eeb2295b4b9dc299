"""The path store: each checkpoint goes to a path the caller names (Lightning's `.ckpt` paths).

Local paths: the file is written as a hidden sibling `.NAME.fastckpt-PID-COUNTER.tmp`,
made durable, renamed over NAME and the directory fsync'ed, so NAME is the old checkpoint
or the new one, complete — never a torn mix, and never there before it is durable.

URLs (`s3://`, `gcs://`, `memory://`, ...): the file is staged on local disk, uploaded, and then
its commit record written last (fastckpt.store.url_files: s3:// through the S3 store's client,
others through fsspec); a reader checks NAME against that record when it exists. `file://` URLs
are plain local paths.

Per-rank saving (every rank saves the same step): NAME is a directory holding one
`rank-R.<id>` file per rank and a COMMIT record naming them, written atomically by
rank 0 once all are durable; files of the previous version are deleted after it.
"""
from __future__ import annotations

import glob
import itertools
import os
import re
import shutil
import tempfile
from typing import Any, Callable, Optional

from ..commit import record as commit
from ..commit.record import file_size
from ..commit_info import CommitInfo
from ..errors import CheckpointWriteError, CorruptCheckpointError
from ..format import load_file
from ..fsutil import fsync_dir, makedirs_durable
from .protocol import ByPath, Listed, Store
from . import url_files
from .root_store import RootStore
from .url_files import AS_AWS_TOOLS, MARKER_SUFFIX, Remote

TMP_GLOB = ".*.fastckpt-*.tmp"
TMP_RE = re.compile(r"^\.(.+)\.fastckpt-\d+-\d+\.tmp$")  # a file in flight (or a dead writer's)
CHECKPOINT_EXT = (".ckpt", ".pt", ".pth", ".bin", ".safetensors")  # what a folder of checkpoint files holds
_removals = itertools.count()


def is_remote(path) -> bool:
    """True for fsspec URLs other than file://."""
    p = os.fspath(path)
    return "://" in p and not p.startswith("file://")


def local_path(path) -> str:
    p = os.fspath(path)
    return os.path.abspath(p[len("file://"):] if p.startswith("file://") else p)


def local_target(path) -> str:
    """A local path one file is saved at: its directory exists and it is not a directory itself
    (FileNotFoundError / IsADirectoryError naming it otherwise)."""
    target = local_path(path)
    parent = os.path.dirname(target)
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"cannot save to {target!r}: directory {parent!r} does not exist")
    if os.path.isdir(target):
        raise IsADirectoryError(f"cannot save to {target!r}: it is a directory")
    return target


class PathStore(Store, ByPath):
    """The store protocol for caller-named paths; no retention, no `latest`."""

    kind = "path"
    survey_kind = "files"
    root = None
    names_by_path = True

    places_loosely = True  # any folder of checkpoint files

    def __init__(self, per_rank: bool = False, remote: Remote = AS_AWS_TOOLS):
        self.per_rank, self.remote = per_rank, remote
        self._staging = None
        self.folder: Optional[str] = None  # opened at a folder to read it (place_at)

    @classmethod
    def open(cls, config, rank: int, world_size: int) -> "PathStore":
        return cls(per_rank=world_size > 1, remote=Remote.of(config))

    # -- the command's view --------------------------------------------------
    @classmethod
    def place_at(cls, path: str) -> Optional["PathStore"]:
        """A folder of checkpoint files (Lightning's ModelCheckpoint: *.ckpt, per-rank folders)."""
        store = cls()
        store.folder = store.place = path
        return store if os.path.isdir(path) and store.listing() else None

    def listing(self) -> list[Listed]:
        rows = []
        try:
            names = sorted(os.listdir(self.folder))
        except OSError:  # unreadable: nothing listed (the command says what it cannot read elsewhere)
            names = []
        for name in names:
            path = os.path.join(self.folder, name)
            tmp = TMP_RE.match(name)
            if tmp:  # listed under its own name: it is no checkpoint, and its target may not exist
                rows.append(Listed(name, path, "temporary", f"{tmp.group(1)} being saved, or a save of it a kill "
                                   "cut short; the next save into this folder removes it", time=os.path.getmtime(path)))
            elif name.endswith(MARKER_SUFFIX) or not name.endswith(CHECKPOINT_EXT):
                continue
            elif os.path.isdir(path) and os.path.exists(os.path.join(path, commit.COMMIT_NAME)):
                try:
                    info = commit.read(path)
                    rows.append(Listed(name, path, "committed", info=info, time=info.time))
                except (CorruptCheckpointError, OSError) as e:
                    rows.append(Listed(name, path, "invalid", str(e), time=os.path.getmtime(path)))
            elif os.path.isdir(path):
                rows.append(Listed(name, path, "incomplete", "a per-rank checkpoint folder without its COMMIT record",
                                   time=os.path.getmtime(path)))
            elif os.path.isfile(path):
                rows.append(Listed(name, path, "complete", time=os.path.getmtime(path)))
        return sorted(rows, key=lambda r: -(r.time or 0))

    # -- ByPath ------------------------------------------------------------
    def prepare_path(self, path: str) -> None:
        if is_remote(path):
            url_files.prepare(path)
        else:
            makedirs_durable(os.path.dirname(local_path(path)))

    def load_path(self, path: str, rank: int, map_location=None, verify: bool = True, weights_only: bool = True,
                  mmap: Optional[bool] = None):
        return read_path(path, rank, map_location, verify, weights_only, mmap, self.remote)

    def size_of(self, path: str) -> Optional[int]:
        """The file's size; at a URL, what its commit record says (the object's own size when
        another writer put it there without one)."""
        if not is_remote(path):
            return file_size(local_path(path))
        return url_files.size_at(path, self.remote)

    def remove_path(self, path: str, later=None) -> None:
        remove(path, later, self.remote)

    def prepare(self) -> None:
        pass

    def next_counter(self) -> int:
        return 1

    def remove_uncommitted(self) -> None:
        pass

    def retain(self, keep: int, in_flight: set) -> None:
        pass

    def committed(self, problems: list | None = None) -> list:
        return []

    def begin(self, step: int, counter: int, rank: int, fmt: str, target=None, plan=None,
              meta=None) -> tuple[str, str]:
        target = os.fspath(target)
        if is_remote(target):
            if self.per_rank:
                raise CheckpointWriteError(f"per-rank saving to a URL ({target}) is not supported; "
                                           "use a local or mounted path")
            if self._staging is None:
                self._staging = tempfile.mkdtemp(prefix="fastckpt-upload-")
            return target, os.path.join(self._staging, f"{counter}-{rank}.tmp")
        target = local_path(target)
        if self.per_rank:  # a fresh name each time: the old COMMIT keeps vouching for old files
            makedirs_durable(target)
            stem, ext = RootStore.file_name(rank, fmt).rsplit(".", 1)
            return target, os.path.join(target, f"{stem}.{os.getpid()}-{counter}.{ext}")
        target = local_target(target)
        parent, name = os.path.split(target)
        sweep_dead_tmp(parent)
        return target, os.path.join(parent, f".{name}.fastckpt-{os.getpid()}-{counter}.tmp")

    def commit_file(self, ckpt_id: str, file_path: str, result) -> str:
        """Makes this rank's durable file visible at its name; returns that name."""
        if is_remote(ckpt_id):
            url_files.upload(file_path, ckpt_id, result, self.remote)
            return ckpt_id
        if self.per_rank:
            return file_path
        os.replace(file_path, ckpt_id)
        fsync_dir(os.path.dirname(ckpt_id))
        return ckpt_id

    def commit(self, info: CommitInfo) -> None:
        if self.per_rank:  # switches atomically from the old set of rank files to the new one
            commit.write(info)
            keep = {f.name for f in info.files}
            for old in glob.glob(os.path.join(info.path, "rank-*")):
                if os.path.basename(old) not in keep:
                    _unlink_quietly(old)

    def abort(self, ckpt_id: str, file_path: str, rank: int, stuck: bool = False) -> None:
        if file_path is not None:
            _unlink_quietly(file_path)

    def close(self) -> None:
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None


def read_path(path: str, rank: int, map_location=None, verify: bool = True, weights_only: bool = True,
              mmap: Optional[bool] = None, remote: Remote = AS_AWS_TOOLS):
    """What a path holds, read back: a URL (checked against its commit record when it has one), a
    per-rank folder (this rank's file, as its COMMIT names it), or a plain file."""
    if is_remote(path):
        return url_files.load_url(path, map_location, verify, weights_only, remote)
    local = local_path(path)
    if os.path.isdir(local):  # per-rank checkpoint directory
        info = commit.read(local)
        return load_file(info.file_for(rank), map_location, verify, weights_only,
                         expect_crc=info.entry_for(rank).crc32 if verify else None)
    if not os.path.exists(local):
        raise FileNotFoundError(f"Checkpoint file not found: {path}")  # Lightning's own words
    return load_file(local, map_location=map_location, verify=verify, weights_only=weights_only, mmap=mmap)


def remove(path, later: Optional[Callable[[Callable[[], None]], Any]] = None, remote: Remote = AS_AWS_TOOLS) -> None:
    """Deletes a checkpoint at a local path or URL; URLs: commit record first, then the data.

    A local path is renamed at once to a hidden `.NAME.fastckpt-PID-rmN.tmp`, so the name is
    gone when this returns; freeing the data (tens of ms for a large file on ext4) runs through
    `later(fn)` when given (a background executor), inline otherwise. A crash in between
    leaves a dead writer's temporary file, which the next save into that directory sweeps.
    """
    p = os.fspath(path)
    if is_remote(p):
        url_files.remove_url(p, remote)
        return
    p = local_path(p)
    if not os.path.lexists(p):
        return
    parent, name = os.path.split(p)
    hidden = os.path.join(parent, f".{name}.fastckpt-{os.getpid()}-rm{next(_removals)}.tmp")
    os.rename(p, hidden)
    if later is None:
        _delete_quietly(hidden)
    else:
        later(lambda: _delete_quietly(hidden))


def sweep_dead_tmp(parent: str) -> None:
    """Temporary files of writers that died (their pid is gone) are removed: a path's hidden
    sibling (this store's) and a memory tier's hidden folder of a copy to that path
    (fastckpt.store.path_tier) alike."""
    for tmp in glob.glob(os.path.join(parent, TMP_GLOB)):
        try:
            pid = int(os.path.basename(tmp).rsplit(".fastckpt-", 1)[1].split("-")[0])
        except (IndexError, ValueError):
            continue
        if pid != os.getpid() and not pid_alive(pid):
            _delete_quietly(tmp)


def pid_alive(pid: int) -> bool:
    """Whether a process of this pid runs (the writer of a temporary file, of a spool folder)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _delete_quietly(path: str) -> None:
    """A file, or a per-rank checkpoint directory, gone; already gone is fine."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        _unlink_quietly(path)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
