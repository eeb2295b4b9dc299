"""The path store: each checkpoint goes to a path the caller names (Lightning's `.ckpt` paths).

Local paths: the file is written as a hidden sibling `.NAME.fastckpt-PID-COUNTER.tmp`,
made durable, renamed over NAME and the directory fsync'ed, so NAME is the old checkpoint
or the new one, complete — never a torn mix, and never there before it is durable.

URLs (`s3://` through the S3 store's client, fastckpt.store.s3.client; `gcs://`, `memory://`,
... through fsspec): the file is staged on local disk, uploaded, and then its commit record
`NAME.fastckpt-commit` (fastckpt.commit.record's: the file's size, whole-file CRC and chunk CRCs)
is written last; an s3:// one is read back by parallel ranged GETs. Object stores have no atomic rename, so a reader checks NAME against that
record when it exists; a URL without one (a file fastckpt did not upload) is read as
Lightning would read it, checked by its own CRCs. `file://` URLs are plain local paths.

Per-rank saving (every rank saves the same step): NAME is a directory holding one
`rank-R.<id>` file per rank and a COMMIT record naming them, written atomically by
rank 0 once all are durable; files of the previous version are deleted after it.
"""
from __future__ import annotations

import glob
import itertools
import json
import os
import re
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..commit import record as commit
from ..commit.record import file_size
from ..commit_info import CommitInfo, FileEntry
from ..errors import CheckpointWriteError, CorruptCheckpointError
from ..format import load_file, sniff
from ..machine import read_threads
from ..fsutil import fsync_dir, makedirs_durable
from .protocol import ByPath, Listed, Store
from .root_store import RootStore
from .s3.client import GET_BYTES, MIN_PART, UPLOAD_CONCURRENCY, bucket_for
from .s3.place import S3Place, is_s3

MARKER_SUFFIX = ".fastckpt-commit"
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


def filesystem(url: str):
    """The fsspec filesystem of url, its listing cache of url's folder dropped: fsspec shares one
    instance per process (Lightning's own listings fill it), and a stale entry would say an object
    just uploaded, or its record, is not there."""
    import fsspec
    fs, _ = fsspec.core.url_to_fs(url)
    fs.invalidate_cache(url.rstrip("/").rsplit("/", 1)[0])
    return fs


@dataclass(frozen=True)
class Remote:
    """How s3:// paths are reached: the settings' `endpoint` (None: as AWS tools find the server),
    the time one request may take, and the size of one part of an upload (the settings' chunk_mb)."""

    endpoint: Optional[str] = None
    timeout_s: float = 120.0
    part_bytes: int = 64 << 20


AS_AWS_TOOLS = Remote()


def object_of(url: str, remote: Remote = AS_AWS_TOOLS):
    """(the S3 store's client, the key) of an s3:// URL; None for other schemes, which fsspec serves."""
    if not is_s3(url):
        return None
    place = S3Place.parse(url, "the checkpoint path")
    return bucket_for(place, remote.endpoint, remote.timeout_s), place.prefix


def forget_listing(url: str) -> None:
    """fsspec's listing cache of url's folder dropped, where fsspec serves the scheme at all (Lightning
    lists the folder through it: its next listing sees what was just put or deleted)."""
    try:
        filesystem(url)
    except ImportError:  # no fsspec filesystem for it here (s3fs missing): nothing cached either
        pass


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
        return cls(per_rank=world_size > 1, remote=Remote(config.endpoint, config.stall_timeout_s,
                                                          max(MIN_PART, config.chunk_mb << 20)))

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
        if is_s3(path):
            return  # a bucket has no folders to make
        if is_remote(path):
            filesystem(path).makedirs(path.rsplit("/", 1)[0], exist_ok=True)
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
        found = object_of(path, self.remote)
        if found is not None:
            bucket, key = found
            if bucket.size_of(key + MARKER_SUFFIX) is not None:
                return read_marker(path, self.remote)["size"]
            return bucket.size_of(key)
        fs = filesystem(path)
        if fs.exists(path + MARKER_SUFFIX):
            return read_marker(path)["size"]
        return fs.size(path) if fs.exists(path) else None

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
            _upload(file_path, ckpt_id, result, self.remote)
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


def _upload(local: str, url: str, result, remote: Remote) -> None:
    """Data first, the commit record last (object stores have no atomic rename); the old record is
    deleted first, so that it never vouches for the new bytes mid-upload."""
    found = object_of(url, remote)
    fs = None if found is not None else filesystem(url)
    marker = url + MARKER_SUFFIX
    try:
        if found is not None:
            bucket, key = found
            bucket.delete([key + MARKER_SUFFIX])
            try:
                bucket.put_file(key, local, remote.part_bytes, UPLOAD_CONCURRENCY)
            except OSError as e:
                raise CheckpointWriteError(str(e)) from e
        else:
            if fs.exists(marker):
                fs.rm(marker)
            fs.put_file(local, url)
        parent, name = url.rsplit("/", 1)
        entry = FileEntry(name, 0, result.bytes, result.file_crc, [list(s) for s in result.spans], result.names or [])
        info = CommitInfo(step=-1, path=parent, bytes=result.bytes, counter=1, time=time.time(), world_size=1,
                          format=sniff(local), files=(entry,))
        if found is not None:
            commit.write_with(info, lambda raw: found[0].put_bytes(found[1] + MARKER_SUFFIX, raw))
            forget_listing(url)
        else:
            commit.write(info, name + MARKER_SUFFIX, fs=fs)
    finally:
        _unlink_quietly(local)


def read_path(path: str, rank: int, map_location=None, verify: bool = True, weights_only: bool = True,
              mmap: Optional[bool] = None, remote: Remote = AS_AWS_TOOLS):
    """What a path holds, read back: a URL (checked against its commit record when it has one), a
    per-rank folder (this rank's file, as its COMMIT names it), or a plain file."""
    if is_remote(path):
        return _load_url(path, map_location, verify, weights_only, remote)
    local = local_path(path)
    if os.path.isdir(local):  # per-rank checkpoint directory
        info = commit.read(local)
        return load_file(info.file_for(rank), map_location, verify, weights_only,
                         expect_crc=info.entry_for(rank).crc32 if verify else None)
    if not os.path.exists(local):
        raise FileNotFoundError(f"Checkpoint file not found: {path}")  # Lightning's own words
    return load_file(local, map_location=map_location, verify=verify, weights_only=weights_only, mmap=mmap)


def _load_url(url: str, map_location, verify: bool, weights_only: bool, remote: Remote):
    tmp = tempfile.mkdtemp(prefix="fastckpt-download-")
    try:
        local, crc = download(url, tmp, remote)
        if crc is None:
            warnings.warn(f"fastckpt: {url} has no fastckpt commit record ({url}{MARKER_SUFFIX}): "
                          "it was not uploaded by fastckpt (or its upload was cut short after the data); "
                          "loaded as Lightning would, checked only by its own CRCs", stacklevel=6)
        return load_file(local, map_location, verify, weights_only, expect_crc=crc, mmap=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_marker(url: str, remote: Remote = AS_AWS_TOOLS) -> dict:
    """The commit record of an uploaded checkpoint: {"size", "crc32"}; CorruptCheckpointError
    if missing or bad. A record fastckpt 0.1 wrote (plain JSON: size, hex crc32) still reads."""
    path = url + MARKER_SUFFIX
    found = object_of(url, remote)
    try:
        if found is not None:
            raw = found[0].get_bytes(found[1] + MARKER_SUFFIX, commit.MAX_RECORD + 1)
        else:
            with filesystem(url).open(path, "rb") as f:
                raw = f.read(commit.MAX_RECORD + 1)
    except FileNotFoundError as e:
        raise CorruptCheckpointError(f"{url} has no commit record ({path}): its upload never finished") from e
    try:
        body = json.loads(raw)
        if isinstance(body, dict) and "body" not in body:  # 0.1
            return {"size": int(body["size"]), "crc32": int(body["crc32"], 16)}
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise CorruptCheckpointError(f"the commit record of {url} is unreadable: {e}") from e
    info = commit.decode(raw, path)
    if len(info.files) != 1 or info.files[0].name != url.rsplit("/", 1)[1]:
        raise CorruptCheckpointError(f"the commit record of {url} names other files: {[f.name for f in info.files]}")
    return {"size": info.files[0].bytes, "crc32": info.files[0].crc32}


def download(url: str, into_dir: str, remote: Remote = AS_AWS_TOOLS) -> tuple[str, int | None]:
    """Copies a checkpoint at a URL to a local file; returns (path, the whole-file CRC its
    commit record expects). A URL without a commit record (a file fastckpt did not upload)
    comes back with None: its loader checks it by the file's own CRCs only."""
    local = os.path.join(into_dir, "download.tmp")
    found = object_of(url, remote)
    if found is not None:  # parallel ranged GETs
        bucket, key = found
        rec = read_marker(url, remote) if bucket.size_of(key + MARKER_SUFFIX) is not None else None
        size = bucket.size_of(key)
        if size is None:
            raise FileNotFoundError(f"checkpoint {url!r} does not exist")
        bucket.download(key, local, size, GET_BYTES, read_threads())
    else:
        fs = filesystem(url)
        rec = read_marker(url) if fs.exists(url + MARKER_SUFFIX) else None
        try:
            fs.get_file(url, local)
        except FileNotFoundError:
            raise FileNotFoundError(f"checkpoint {url!r} does not exist") from None
    size = os.path.getsize(local)
    if rec is not None and size != rec["size"]:
        raise CorruptCheckpointError(f"{url} is {size} bytes but its commit record says {rec['size']}")
    return local, rec["crc32"] if rec is not None else None


def remove(path, later: Optional[Callable[[Callable[[], None]], Any]] = None, remote: Remote = AS_AWS_TOOLS) -> None:
    """Deletes a checkpoint at a local path or URL; URLs: commit record first, then the data.

    A local path is renamed at once to a hidden `.NAME.fastckpt-PID-rmN.tmp`, so the name is
    gone when this returns; freeing the data (tens of ms for a large file on ext4) runs through
    `later(fn)` when given (a background executor), inline otherwise. A crash in between
    leaves a dead writer's temporary file, which the next save into that directory sweeps.
    """
    p = os.fspath(path)
    found = object_of(p, remote)
    if found is not None:
        found[0].delete([found[1] + MARKER_SUFFIX])  # the record first: never one without its object
        found[0].delete([found[1]])
        forget_listing(p)
        return
    if is_remote(p):
        fs = filesystem(p)
        for name in (p + MARKER_SUFFIX, p):
            try:
                fs.rm(name, recursive=True)
            except FileNotFoundError:
                pass
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
