"""Which tag a DeepSpeed load reads: what DeepSpeed itself would load, checked by fastckpt.

DeepSpeed loads the tag it is given, or the one its `latest` file names (`latest_universal`
for universal checkpoints). Under `save_dir`, a tag is
  committed  fastckpt's record is there and every file it names has its size: loaded;
  torn       fastckpt began it (its open mark, a writer's hidden file) and never committed it
             (a save cut short): never loaded;
  damaged    its record is unreadable or disagrees with the files: never loaded;
  foreign    checkpoint files another engine wrote or put there (DeepSpeed's own before
             fastckpt was switched on, ds_to_universal, which also copies fastckpt's
             model-state files into its tag): there is no record to check, so it is
             loaded as DeepSpeed would load it, and a warning says so;
  empty      a directory without checkpoint files (a save cut short before any file);
  missing    no such directory.
An explicit tag loads when committed or foreign; otherwise a CorruptCheckpointError says
why. Without a tag: the tag `latest` names when it is committed or foreign; else (no
`latest`, or it names a torn, damaged, empty or missing tag) the newest committed tag, and a
warning says what `latest` named; with no committed tag either, nothing (and a warning).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Callable, Optional

from fastckpt.errors import CorruptCheckpointError
from fastckpt.fsutil import read_regular

from .tags import TAG_OPEN, TAG_RECORD, newest_committed, read_record

SizeOf = Callable[[str], Optional[int]]


@dataclass
class Choice:
    """The tag to load (None: nothing), what it is, and what the user should be told."""

    tag: Optional[str]
    status: str
    warning: str = ""
    error: str = ""


def _files_of(tag_dir: str) -> tuple[bool, bool]:
    """(fastckpt began this tag, another writer's checkpoint files are there). Ours: the mark
    a fastckpt save leaves first, a writer's hidden temporary file, a pool pointer. A file
    carrying fastckpt's CRC in a tag without the mark was put there by someone else (a copy)."""
    try:
        names = os.listdir(tag_dir)
    except OSError:
        return False, False
    ours = foreign = False
    for name in names:
        path = os.path.join(tag_dir, name)
        if name == TAG_OPEN or (".fastckpt-" in name and name.endswith(".tmp")):
            ours = True
        elif name != TAG_RECORD and os.path.isfile(path) and not os.path.islink(path):
            if is_pool_pointer(path):
                ours = True
            elif name.endswith(".pt"):
                foreign = True
    return ours, foreign


def is_pool_pointer(path: str) -> bool:
    """Whether path is the small file a pool-backed engine leaves where a tag's file would be."""
    try:
        body = json.loads(read_regular(path, 4096))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(body, dict) and "fastckpt_pool" in body


def tag_status(save_dir: str, tag: str, size_of: SizeOf) -> tuple[str, str]:
    """(committed | torn | damaged | foreign | empty | missing, why)."""
    tag_dir = os.path.join(save_dir, tag)
    if not tag or os.path.basename(os.path.normpath(tag)) != os.path.normpath(tag) or not os.path.isdir(tag_dir):
        return "missing", f"there is no tag {tag!r} in {save_dir}"
    if os.path.exists(os.path.join(tag_dir, TAG_RECORD)):
        try:
            read_record(save_dir, tag, size_of)
            return "committed", ""
        except CorruptCheckpointError as e:
            return "damaged", str(e)
    ours, foreign = _files_of(tag_dir)
    if ours:
        return "torn", (f"tag {tag!r} in {save_dir} was never committed (no {TAG_RECORD}): fastckpt's save of it "
                        "did not complete")
    if not foreign:
        return "empty", f"tag {tag!r} in {save_dir} holds no checkpoint file (a save cut short?)"
    return "foreign", (f"tag {tag!r} in {save_dir} has no fastckpt commit record: it was written by another "
                       "checkpoint engine, so it is loaded as DeepSpeed would load it, without fastckpt's checks")


def read_latest(save_dir: str, latest_file: str) -> Optional[str]:
    """The tag DeepSpeed's `latest` file names (None: no file, or not a tag name)."""
    try:
        raw = read_regular(os.path.join(save_dir, latest_file), 4096).decode().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return raw or None


def choose(save_dir: str, tag: Optional[str], size_of: SizeOf, latest_file: str = "latest") -> Choice:
    """What a load of `save_dir` with `tag` (None: DeepSpeed's latest) reads; see the module docstring."""
    if tag is not None:
        status, why = tag_status(save_dir, str(tag), size_of)
        if status in ("committed", "foreign"):
            return Choice(str(tag), status, why if status == "foreign" else "")
        return Choice(None, status, error=why)
    named = read_latest(save_dir, latest_file)
    status, why = tag_status(save_dir, named, size_of) if named else ("missing", f"no {latest_file!r} file")
    if status in ("committed", "foreign"):
        return Choice(named, status, why if status == "foreign" else "")
    newest = newest_committed(save_dir, size_of)
    if newest is not None:
        note = "" if named is None else f"{latest_file!r} names {named!r}, which is not loadable ({why}); "
        return Choice(newest, "committed", f"{note}loading the newest committed tag {newest!r}" if note else "")
    return Choice(None, status, warning=f"no checkpoint to load under {save_dir}: {why}, and no tag there was "
                                        "committed by fastckpt; nothing was loaded")
