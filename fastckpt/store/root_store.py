"""The root store: one directory per checkpoint under a root, plus a `latest` pointer.

Layout:  ROOT/step-00000100.c000007/{rank-0.pt, rank-1.pt, COMMIT}  and  ROOT/latest
Owns naming (the counter in the name orders checkpoints even when steps
repeat), listing committed checkpoints, moving `latest` forward atomically,
retention (`keep`), and removing directories that never committed. The layout's rules that hold
wherever it lies (`StepFolders`: the counter, `latest`, retention, the listing) are the S3 store's
and a memory tier's too. Each rank's next file is made
ahead once a checkpoint landed (fastckpt.store.ahead: `ROOT/.ahead/`), which begin() takes.
"""
from __future__ import annotations

import abc
import json
import os
import re
import shutil
import threading
from typing import Optional

from ..commit import record as commit
from ..commit.committed_under import CommittedUnder
from ..commit_info import CommitInfo
from ..errors import CheckpointWriteError, ConfigError, CorruptCheckpointError
from ..fsutil import fsync_dir, makedirs_durable, read_regular, write_atomic
from . import ahead
from .protocol import Listed, Store
from .tier_copy import copy_part

DIR_RE = re.compile(r"^step-(\d+)\.c(\d+)$")
LATEST = "latest"
EXT = {"torch": "pt", "safetensors": "safetensors"}


def dir_name(step: int, counter: int) -> str:
    """A checkpoint's folder name (DIR_RE reads it back): the same in a root and under a bucket's prefix."""
    return f"step-{step:08d}.c{counter:06d}"


class StepFolders(Store):
    """A root's layout wherever it lies, a folder or a bucket's prefix: the next counter, `latest`
    moved only forward, retention and the listing. Its store says how its folders are seen:
    _seen() (one listing taken for a whole pass, or None: each question asked of the folder
    itself), _dirs(seen), _has_record(path, seen), _read_listed(path, seen); and how the bytes of
    `latest` are read and written."""

    only: Optional[str] = None  # opened at one checkpoint folder (place_at)
    record_word = "record"  # what the listing calls a missing record
    _latest_lock: threading.Lock

    @abc.abstractmethod
    def _dirs(self, seen=None) -> list[tuple[int, int, str]]:
        """(step, counter, path) of every checkpoint folder, committed or not."""

    @abc.abstractmethod
    def _has_record(self, path: str, seen=None) -> bool: ...

    @abc.abstractmethod
    def _read_listed(self, path: str, seen=None) -> CommitInfo:
        """The record of the checkpoint at path, checked (CorruptCheckpointError, OSError)."""

    @abc.abstractmethod
    def _latest_bytes(self) -> bytes: ...

    @abc.abstractmethod
    def _put_latest(self, body: bytes) -> None:
        """`latest` replaced by body, atomically."""

    def _seen(self):
        return None

    def _retained(self, newest: int, in_flight: set) -> None:
        """After retention (`newest`: the newest committed counter): what else the store removes."""

    def next_counter(self) -> int:
        return 1 + max((c for _, c, _ in self._dirs(self._seen())), default=0)

    def move_latest(self, info: CommitInfo) -> None:
        """Points `latest` at info, only forward (by counter), atomically and durably; one thread
        at a time (the read and the write)."""
        with self._latest_lock:
            current = self.read_latest()
            if current is not None and current.get("counter", -1) >= info.counter:
                return
            body = {"dir": os.path.basename(info.path), "step": info.step, "counter": info.counter}
            self._put_latest(json.dumps(body).encode())

    def read_latest(self) -> dict | None:
        try:
            body = json.loads(self._latest_bytes())
            return body if isinstance(body, dict) else None
        except (OSError, ValueError, RecursionError):
            return None

    def _remove_dead(self) -> None:
        """Every checkpoint folder without a record removed (a dead writer's: at the start of a
        writing session, before any rank of it writes)."""
        seen = self._seen()
        for _, _, path in self._dirs(seen):
            if not self._has_record(path, seen):
                self.remove(path)

    def retain(self, keep: int, in_flight: set[str]) -> None:
        """Deletes committed checkpoints beyond the newest `keep`, and dead partial ones older than
        the newest (never one in flight)."""
        seen = self._seen()
        committed = self.committed()
        newest = committed[0].counter if committed else 0
        for info in committed[max(1, keep):] if keep > 0 else []:
            if info.path not in in_flight:
                self.remove(info.path)
        for _, counter, path in self._dirs(seen):
            if counter < newest and path not in in_flight and not self._has_record(path, seen):
                self.remove(path)
        self._retained(newest, in_flight)

    def listing(self) -> list[Listed]:
        """Every checkpoint folder (one, when opened at one), newest first."""
        seen = self._seen()
        latest = (self.read_latest() or {}).get("dir")
        rows = []
        for _, _, path in sorted(self._dirs(seen), key=lambda d: -d[1]):
            name = os.path.basename(path)
            if self.only is not None and name != self.only:
                continue
            is_latest = latest is not None and os.path.basename(os.path.normpath(str(latest))) == name
            if not self._has_record(path, seen):
                rows.append(Listed(name, path, "incomplete",
                                   f"never committed (no {commit.COMMIT_NAME} {self.record_word})"))
                continue
            try:
                rows.append(Listed(name, path, "committed", info=self._read_listed(path, seen), latest=is_latest))
            except (CorruptCheckpointError, OSError) as e:
                rows.append(Listed(name, path, "invalid", str(e), latest=is_latest))
        return rows


class RootStore(StepFolders):
    kind = survey_kind = "root"
    makes_ahead = True  # each rank's next file made once a checkpoint landed (store.ahead)

    def __init__(self, root: str):
        self.root = os.path.abspath(os.fspath(root))
        self.only: Optional[str] = None  # opened at one checkpoint folder (place_at)
        self._latest_lock = threading.Lock()  # two commit threads may move it (a tier's saves and copies)
        self._ahead_names: set[str] = set()  # the files this process made ahead (removed at close)
        self._taken: set[str] = set()  # parts begun in a file made ahead, until finish_write

    @classmethod
    def open(cls, config, rank: int, world_size: int) -> "RootStore":
        if config.root is None:
            raise ConfigError("store='root' needs a root directory")
        return cls(config.root)

    # -- writing ---------------------------------------------------------
    def prepare(self) -> None:
        try:
            makedirs_durable(self.root)
        except OSError as e:
            raise CheckpointWriteError(f"cannot create checkpoint root {self.root!r}: {e.strerror}") from e
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise CheckpointWriteError(f"checkpoint root {self.root!r} is not writable; "
                                       "choose another directory or fix its permissions")

    def new_dir(self, step: int, counter: int) -> str:
        """A checkpoint's folder, made on the caller's thread inside save(); its name is made durable
        on the commit thread, before the record (commit.record.write fsyncs the folder and the root,
        which prepare() made durable): no fsync inside save()."""
        path = os.path.join(self.root, dir_name(step, counter))
        os.makedirs(path, exist_ok=True)
        return path

    @staticmethod
    def file_name(rank: int, fmt: str) -> str:
        return f"rank-{rank}.{EXT[fmt]}"

    def put_copy(self, src: str, folder: str, entry, direct_io: bool = True):
        """A part committed on a tier in front copied into folder, checked first (tier_copy.copy_part);
        None: its entry here is the same."""
        copy_part(src, os.path.join(folder, entry.name), entry, direct_io)
        return None

    # -- the store protocol the Checkpointer drives ----------------------
    def begin(self, step: int, counter: int, rank: int, fmt: str, target=None, plan=None,
              meta=None) -> tuple[str, str]:
        """(checkpoint id, path this rank writes) for a new checkpoint, the file made ahead
        for it moved there when there is one; target is unused here."""
        ckpt_dir, name = self.new_dir(step, counter), self.file_name(rank, fmt)
        part = os.path.join(ckpt_dir, name)
        if ahead.take(self.root, name, part):
            self._taken.add(part)
        return ckpt_dir, part

    def make_ahead(self, rank: int, fmt: str, nbytes: int) -> None:
        name = self.file_name(rank, fmt)
        if self.makes_ahead and ahead.make(self.root, name, nbytes):
            self._ahead_names.add(name)

    def finish_write(self, write, part: str):
        """The commit thread: a part begun in a file made ahead has the folder it came from made
        durable first, while its bytes are still being written (a rename is durable once both
        folders are fsync'ed; the record fsyncs the checkpoint's own); then the part, durable."""
        if part in self._taken:
            self._taken.discard(part)
            ahead.durable_moves(self.root)
        return write.finish()

    def commit_file(self, ckpt_id: str, file_path: str, result) -> str:
        """Each rank, once its file is durable; returns where the file now is."""
        return file_path

    def commit(self, info: CommitInfo) -> None:
        """Rank 0, once every rank's file is durable."""
        commit.write(info)
        self.move_latest(info)

    def abort(self, ckpt_id: str, file_path: str, rank: int, stuck: bool = False) -> None:
        self._taken.discard(file_path)
        if rank == 0 and ckpt_id is not None:
            self.remove(ckpt_id)

    def close(self) -> None:
        """This process's files made ahead removed."""
        names, self._ahead_names = self._ahead_names, set()
        if names:
            ahead.clear(self.root, names)

    def _latest_bytes(self) -> bytes:
        return read_regular(os.path.join(self.root, LATEST), 4096)

    def _put_latest(self, body: bytes) -> None:
        write_atomic(os.path.join(self.root, LATEST), body)

    def remove(self, path: str) -> None:
        """Un-commits first (a crash mid-removal leaves an uncommitted dir, never a hollow commit)."""
        try:
            CommittedUnder(self.root).withdraw(path)
        except OSError:
            pass
        shutil.rmtree(path, ignore_errors=True)
        try:
            fsync_dir(self.root)
        except OSError:
            pass

    def remove_uncommitted(self) -> None:
        """At the start of a writing session: drop directories a dead writer left, and the
        files made ahead before it (it may have been cut short making one)."""
        ahead.clear(self.root)
        self._remove_dead()

    # -- reading ---------------------------------------------------------
    def _dirs(self, seen=None) -> list[tuple[int, int, str]]:
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        out = []
        for n in names:
            m = DIR_RE.match(n)
            if m:
                out.append((int(m.group(1)), int(m.group(2)), os.path.join(self.root, n)))
        return out

    def _has_record(self, path: str, seen=None) -> bool:
        return os.path.exists(os.path.join(path, commit.COMMIT_NAME))

    def _read_listed(self, path: str, seen=None) -> CommitInfo:
        return commit.read(path)

    def committed(self, problems: list | None = None) -> list[CommitInfo]:
        """Valid commit records, newest first (by counter); why others were passed over is
        appended to problems."""
        return CommittedUnder(self.root, every_rank=True,
                              children=lambda name: DIR_RE.match(name) is not None).newest_first(problems)

    @classmethod
    def place_at(cls, path: str) -> Optional["RootStore"]:
        """A root (it holds step-N.cK folders), or one checkpoint folder of a root (a rank's folder
        of a memory tier is NodeTier's: SURVEYED asks it first)."""
        if DIR_RE.match(os.path.basename(path)) and os.path.isdir(path):
            store = cls(os.path.dirname(path))
            store.only, store.single, store.place = os.path.basename(path), True, path
            return store
        try:
            names = os.listdir(path)
        except OSError:
            return None
        if not any(DIR_RE.match(n) for n in names):
            return None
        store = cls(path)
        store.place = path
        return store

