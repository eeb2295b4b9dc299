"""What a path holds, as the `fastckpt` command sees it: every folder a plugin writes.

survey(path) names the kind and lists its checkpoints, from records and names alone
(nothing but small headers is read):
  root        a Checkpointer's root (step-N.cK/ folders with COMMIT records, `latest`)
  checkpoint  one such folder, or a Lightning per-rank checkpoint folder (COMMIT inside)
  (a plugin's kinds: a folder of its checkpoints and one of them, e.g. `deepspeed` and `tag`,
   declared by the plugin: fastckpt.tools.folder_kinds)
  files       a folder of checkpoint files (Lightning's ModelCheckpoint: *.ckpt)
  file        one checkpoint file (ours, torch.save's, safetensors, or a pool pointer)
  pool        a persistent-memory pool (a file, /dev/daxN.M, or a folder holding fastckpt.pool)
  nothing     a folder without checkpoints (`hints`: folders under it that have some)
  missing     no such path

Each Entry's status says how far it was checked without reading its bytes:
  committed   a commit record names it and its files have the sizes the record says
  complete    a file renamed into place whole (atomically); no record to compare it with
  foreign     another engine's DeepSpeed tag: no fastckpt record
  incomplete  a save in flight, or one cut short (never loaded)
  invalid     its record is damaged or disagrees with its files (never loaded)
"Verified" is stronger and only `fastckpt verify` (fastckpt.verify) says it: every byte read
and its CRC-32s checked. `checks` lists what verify reads: (file, its record entry or None).
"""
from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..commit import record as commit
from ..commit.record import FileEntry
from ..errors import CorruptCheckpointError, UnsafeCheckpointError
from ..pmem.pointer import is_pool_pointer
from ..store.root_store import DIR_RE, RootStore
from ..store.path_store import MARKER_SUFFIX
from .folder_kinds import plugin_kinds

CHECKPOINT_EXT = (".ckpt", ".pt", ".pth", ".bin", ".safetensors")
TMP_RE = re.compile(r"^\.(.+)\.fastckpt-\d+-\d+\.tmp$")  # the path store's file in flight
HINT_DEPTH = 4


@dataclass
class Entry:
    name: str
    path: str
    status: str
    detail: str = ""
    step: Optional[int] = None
    bytes: Optional[int] = None
    time: Optional[float] = None
    latest: bool = False
    checks: list[tuple[str, Optional[FileEntry]]] = field(default_factory=list)


@dataclass
class Survey:
    kind: str
    path: str
    entries: list[Entry] = field(default_factory=list)
    note: str = ""
    hints: list[str] = field(default_factory=list)
    single: bool = False  # the path is one checkpoint (one the user asked about)
    loading: Callable = contextlib.nullcontext  # the context its files are read in (a plugin kind's)


def survey(path: str) -> Survey:
    path = os.path.abspath(os.fspath(path))
    if not os.path.exists(path):
        return Survey("missing", path, note=f"{path} does not exist")
    if _is_pool(path):
        return Survey("pool", path)
    if not os.path.isdir(path):
        return Survey("file", path, [_file_entry(path)], single=True)
    names = sorted(os.listdir(path))
    if commit.COMMIT_NAME in names:
        return Survey("checkpoint", path, [_commit_entry(path)], single=True)
    if DIR_RE.match(os.path.basename(path)):
        return Survey("checkpoint", path, [Entry(os.path.basename(path), path, "incomplete",
                                                 detail=f"never committed (no {commit.COMMIT_NAME} record)")],
                      single=True)
    if _is_pool(os.path.join(path, "fastckpt.pool")):
        return Survey("pool", os.path.join(path, "fastckpt.pool"))
    if any(DIR_RE.match(n) for n in names):
        return _root(path)
    for kind in plugin_kinds():
        if kind.is_one(path, names):
            return Survey(kind.one, path, [kind.entry(os.path.dirname(path), os.path.basename(path), None)],
                          single=True, loading=kind.loading)
        ones = [n for n in names if os.path.isdir(os.path.join(path, n))
                and kind.is_one(os.path.join(path, n), _listdir(os.path.join(path, n)))]
        if ones:
            latest = kind.latest(path)
            entries = [kind.entry(path, n, latest) for n in ones]
            entries.sort(key=lambda e: (-(e.step if e.step is not None else -1), -(e.time or 0)))
            return Survey(kind.many, path, entries, loading=kind.loading)
    entries = [e for e in (_folder_entry(path, n) for n in names) if e is not None]
    if entries:
        entries.sort(key=lambda e: -(e.time or 0))
        return Survey("files", path, entries)
    return Survey("nothing", path, note=f"no checkpoints in {path}", hints=_hints(path))


# -- kinds ----------------------------------------------------------------
def _root(path: str) -> Survey:
    store = RootStore(path)
    latest = (store.read_latest() or {}).get("dir")
    entries = []
    for ckpt_dir, info, status in store.listing():
        if info is None:  # "incomplete (never committed)" or "invalid: why"
            word, _, why = status.partition(": ") if status.startswith("invalid") else status.partition(" (")
            entries.append(Entry(os.path.basename(ckpt_dir), ckpt_dir, word, detail=why.rstrip(")")))
        else:
            entries.append(_info_entry(os.path.basename(ckpt_dir), info))
    for e in entries:
        e.latest = latest is not None and os.path.basename(os.path.normpath(latest)) == e.name
    return Survey("root", path, entries)


def _folder_entry(folder: str, name: str) -> Optional[Entry]:
    path = os.path.join(folder, name)
    tmp = TMP_RE.match(name)
    if tmp:
        return Entry(tmp.group(1), path, "incomplete", detail="a save in flight, or one cut short",
                     time=os.path.getmtime(path))
    if name.endswith(MARKER_SUFFIX) or not name.endswith(CHECKPOINT_EXT):
        return None
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, commit.COMMIT_NAME)):
            return _commit_entry(path)
        return Entry(name, path, "incomplete", detail="a per-rank checkpoint folder without its COMMIT record",
                     time=os.path.getmtime(path))
    return _file_entry(path) if os.path.isfile(path) else None


def _commit_entry(ckpt_dir: str) -> Entry:
    try:
        return _info_entry(os.path.basename(ckpt_dir), commit.read(ckpt_dir))
    except (CorruptCheckpointError, OSError) as e:
        return Entry(os.path.basename(ckpt_dir), ckpt_dir, "invalid", detail=str(e))


def _info_entry(name: str, info) -> Entry:
    ranks = f"{info.world_size} rank{'s' if info.world_size > 1 else ''}"
    return Entry(name, info.path, "committed", detail=f"{info.format}, {ranks}", step=info.step,
                 bytes=info.bytes, time=info.time,
                 checks=[(os.path.join(info.path, f.name), f) for f in info.files])


def _file_entry(path: str) -> Entry:
    name = os.path.basename(path)
    entry = Entry(name, path, "complete", bytes=os.path.getsize(path), time=os.path.getmtime(path),
                  checks=[(path, None)])
    if is_pool_pointer(path):
        entry.detail = "a pointer: the data is in a pool (`fastckpt ls POOL`)"
        return entry
    try:
        entry.detail, entry.step = _describe_file(path)
    except (CorruptCheckpointError, UnsafeCheckpointError, OSError, ValueError) as e:
        entry.status, entry.detail = "invalid", str(e)
    return entry


def _describe_file(path: str) -> tuple[str, Optional[int]]:
    """(format and writer, the training step it records when it is a Lightning checkpoint)."""
    from ..format import sniff
    if sniff(path) == "safetensors":
        return "safetensors", None
    from ..format.torch_format import check_structure
    from ..format.zip_reader import read_index
    idx = read_index(path)
    writer = "by fastckpt" if idx.file_crc is not None else "by torch.save"
    try:
        state = check_structure(path, idx)
    except UnsafeCheckpointError:
        return f"torch, {writer}; names globals a safe load refuses", None
    step = state.get("global_step") if isinstance(state, dict) else None
    epoch = state.get("epoch") if isinstance(state, dict) else None
    where = f", epoch {epoch}" if isinstance(epoch, int) else ""
    return f"torch, {writer}{where}", step if isinstance(step, int) else None


# -- helpers --------------------------------------------------------------
def _is_pool(path: str) -> bool:
    from ..pmem.commands import is_pool
    return os.path.exists(path) and not os.path.isdir(path) and is_pool(path)


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _hints(path: str) -> list[str]:
    """Folders under path (a few levels down) that hold checkpoints: where a user probably meant."""
    found = []
    base = path.rstrip(os.sep).count(os.sep)
    for here, dirs, _ in os.walk(path):
        if here.count(os.sep) - base >= HINT_DEPTH:
            dirs[:] = []
            continue
        for d in sorted(dirs):
            sub = os.path.join(here, d)
            if _holds_checkpoints(sub):
                found.append(sub)
        dirs[:] = [d for d in dirs if os.path.join(here, d) not in found]
    return found


def _holds_checkpoints(path: str) -> bool:
    """Whether a folder directly holds checkpoints of any kind (for hints: names only)."""
    names = _listdir(path)
    return (commit.COMMIT_NAME in names or any(DIR_RE.match(n) for n in names)
            or any(n.endswith(CHECKPOINT_EXT) and not n.startswith(".") for n in names)
            or any(kind.is_one(path, names) or any(os.path.isdir(os.path.join(path, n)) and kind.is_one(
                os.path.join(path, n), _listdir(os.path.join(path, n))) for n in names) for kind in plugin_kinds()))
