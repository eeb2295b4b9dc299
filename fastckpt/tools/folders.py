"""What a path holds, as the `fastckpt` command sees it: every folder a plugin writes.

survey(path) names the kind and lists its checkpoints, from records and names alone
(nothing but small headers is read). Which store's place a path is, and what is there, each
store says itself (the store protocol's place_at and listing); this module only renders it:
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
  foreign     a plugin's folder another engine wrote (a DeepSpeed tag): no fastckpt record
  incomplete  a save in flight, or one cut short (never loaded)
  invalid     its record is damaged or disagrees with its files (never loaded)
A file of a save in flight or of a killed writer (`.NAME.fastckpt-PID-N.tmp`) is no checkpoint:
it is kept apart, under its own name, in `temporaries`. `latest` is the checkpoint the folder's
own pointer names (a root's `latest`, a DeepSpeed folder's); in a folder of checkpoint files,
which keeps none, it is the newest: the highest training step, then the newest file (`by` says which).
"Verified" is stronger and only `fastckpt verify` (fastckpt.verify) says it: every byte read
and its CRC-32s checked. `checks` lists what verify reads: (file, its record entry or None).
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable, Optional

from ..commit import record as commit
from ..commit_info import FileEntry
from ..errors import CorruptCheckpointError, UnsafeCheckpointError
from ..pmem.pointer import is_pool_pointer
from ..store import SURVEYED, S3Store
from ..store.s3.place import is_s3
from .folder_kinds import plugin_kinds

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
    temporaries: list[Entry] = field(default_factory=list)  # files of saves in flight or cut short
    latest_by: str = "pointer"  # "pointer": the folder's own names its latest; "step": the newest by step
    loading: Callable = contextlib.nullcontext  # the context its files are read in (a plugin kind's)
    check: Optional[Callable] = None  # how verify reads one of its files (a plugin kind's; None: the core's)

    def __post_init__(self) -> None:
        if self.check is None:
            from ..verify import verify_one
            self.check = verify_one


def survey(path: str) -> Survey:
    """What path holds: each store says whether path is its place and lists it (the store
    protocol's place_at and listing); a plugin's own kinds of folder are asked before a folder
    with a `COMMIT` is taken for a per-rank folder (a DeepSpeed tag and a DCP checkpoint have
    one too) and before the loosest store (any folder of checkpoint files)."""
    if is_s3(path):
        return _s3_survey(path)
    path = os.path.abspath(os.fspath(path))
    if not os.path.exists(path):
        return Survey("missing", path, note=f"{path} does not exist")
    firm = [cls for cls in SURVEYED if not cls.places_loosely]
    loose = [cls for cls in SURVEYED if cls.places_loosely]
    found = _store_survey(path, firm)
    if found is not None:
        return found
    if not os.path.isdir(path):
        return Survey("file", path, [_file_entry(path)], single=True)
    names = sorted(os.listdir(path))
    for kind in plugin_kinds():
        if kind.is_one(path, names):
            return Survey(kind.one, path, [kind.entry(os.path.dirname(path), os.path.basename(path), None)],
                          single=True, loading=kind.loading, check=kind.check)
        ones = [n for n in names if os.path.isdir(os.path.join(path, n))
                and kind.is_one(os.path.join(path, n), _listdir(os.path.join(path, n)))]
        if ones:
            latest = kind.latest(path)
            entries = [kind.entry(path, n, latest) for n in ones]
            entries.sort(key=lambda e: (-(e.step if e.step is not None else -1), -(e.time or 0)))
            return Survey(kind.many, path, entries, loading=kind.loading, check=kind.check)
    if commit.COMMIT_NAME in names:  # a folder with its record, of no plugin's kind: a per-rank folder
        return Survey("checkpoint", path, [_commit_entry(path)], single=True)
    found = _store_survey(path, loose)
    if found is not None:
        return found
    return Survey("nothing", path, note=f"no checkpoints in {path}", hints=_hints(path))


def _s3_survey(url: str) -> Survey:
    """An s3:// place (or one checkpoint of it): its checkpoints listed as the S3 store lists them;
    verify downloads each object and reads every byte, the store open while it does."""
    store = S3Store.place_at(url)

    @contextlib.contextmanager
    def loading():
        try:
            yield
        finally:
            store.close()

    found = _store_survey(url, [SimpleNamespace(place_at=lambda _: store)], close=False)  # this one store, open
    found.loading, found.check = loading, store.verify_object
    if not found.entries:
        found.note = f"no checkpoints at {url}"
    return found


def _store_survey(path: str, stores: list, close: bool = True) -> Optional[Survey]:
    for cls in stores:
        store = cls.place_at(path)
        if store is None:
            continue
        try:
            rows = store.listing()
        finally:
            if close:
                store.close()
        entries = [_listed_entry(row) for row in rows if row.status != "temporary"]
        temporaries = [Entry(r.name, r.path, r.status, detail=r.detail, time=r.time,
                             bytes=commit.file_size(r.path)) for r in rows if r.status == "temporary"]
        kind = "checkpoint" if store.single else store.survey_kind
        found = Survey(kind, store.place, entries, single=store.single, temporaries=temporaries)
        if kind == "files":
            found.entries = newest_first(entries)
            found.latest_by = "step"
        return found
    return None


def newest_first(entries: list[Entry]) -> list[Entry]:
    """A folder of checkpoint files, which names no latest: the highest training step first (then
    the newest file), and the first that can be loaded (complete or committed) marked latest —
    what `fastckpt export` of the folder takes."""
    ordered = sorted(entries, key=lambda e: (-(e.step if e.step is not None else -1), -(e.time or 0)))
    for e in ordered:
        e.latest = False
    usable = next((e for e in ordered if e.status in ("complete", "committed")), None)
    if usable is not None:
        usable.latest = True
    return ordered


def _listed_entry(row) -> Entry:
    if row.status == "committed":
        entry = _info_entry(row.name, row.info)
    elif row.status == "complete":
        entry = _file_entry(row.path)
    else:
        entry = Entry(row.name, row.path, row.status, detail=row.detail, time=row.time)
    entry.latest = row.latest
    return entry


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
def _places(cls, path: str) -> bool:
    store = cls.place_at(path)
    if store is not None:
        store.close()
    return store is not None


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
    """Whether a folder directly holds checkpoints of any kind (for hints: each store and plugin
    kind asked, reading small records and headers only)."""
    names = _listdir(path)
    return (commit.COMMIT_NAME in names or any(_places(cls, path) for cls in SURVEYED)
            or any(kind.is_one(path, names) or any(os.path.isdir(os.path.join(path, n)) and kind.is_one(
                os.path.join(path, n), _listdir(os.path.join(path, n))) for n in names) for kind in plugin_kinds()))
