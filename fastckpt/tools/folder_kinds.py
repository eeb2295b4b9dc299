"""Kinds of folder a plugin writes by its framework's conventions, as `fastckpt ls` and
`fastckpt verify` read them — declared by the plugin, never known to the core.

A plugin names a FolderKind in the entry-point group `fastckpt.folders` (setup.cfg); the
command loads the plugins' kinds only for a folder that is none of the core's firm kinds
(fastckpt.tools.folders) — loading one imports its plugin, and so its framework (DeepSpeed's
kind: a second or two); a plugin whose framework is not installed is left out quietly. The calls, in the order the command makes them:

  1. `is_one(path, names)`: whether the folder at path (names: its entries) is one checkpoint
     of this kind (a DeepSpeed tag);
  2. `entry(parent, name, latest)`: that one checkpoint as a folders.Entry (its status from
     the kind's own record, its files with their record entries for verify);
  3. `latest(path)`: which of the checkpoints in a folder of them the kind's pointer names;
  4. `loading()`: a context in which `verify` reads the kind's files (the framework's own
     plain-data types a load of them allows);
  5. `check(path, entry)`: `verify` of one of the kind's files, every byte read (default: the
     core's, fastckpt.verify.verify_one, for the formats it knows);
  6. `full_state(path, step)`: (the whole state, which checkpoint) of one checkpoint or of a
     folder of them, for `export` (default: the kind is not exported).
`many` and `one` are the survey kinds of a folder of them and of one (with `describe`, the
words `fastckpt ls` prints for each).
"""
from __future__ import annotations

import abc
import contextlib
import functools
import logging
from importlib.metadata import entry_points
from typing import Optional

log = logging.getLogger("fastckpt")
GROUP = "fastckpt.folders"


class FolderKind(abc.ABC):
    many: str = ""  # the survey kind of a folder of such checkpoints ("deepspeed")
    one: str = ""  # the survey kind of one of them ("tag")
    describe: dict = {}  # survey kind -> what `fastckpt ls` says it is

    @abc.abstractmethod
    def is_one(self, path: str, names: list[str]) -> bool:
        """(1) The folder at path, holding names, is one checkpoint of this kind."""

    @abc.abstractmethod
    def entry(self, parent: str, name: str, latest: Optional[str]):
        """(2) The checkpoint parent/name as a fastckpt.tools.folders.Entry."""

    @abc.abstractmethod
    def latest(self, path: str) -> Optional[str]:
        """(3) The name of the checkpoint the kind's own pointer in path names (None: none)."""

    def loading(self):
        """(4) The context `verify` reads this kind's files in."""
        return contextlib.nullcontext()

    def check(self, path: str, entry) -> str:
        """(5) Every byte of one file checked: a one-line summary, or CorruptCheckpointError."""
        from ..verify import verify_one
        return verify_one(path, entry)

    def full_state(self, path: str, step: Optional[int] = None):
        """(6) (the whole state, the checkpoint it is) for `fastckpt export`."""
        from ..errors import ConfigError
        raise ConfigError(f"fastckpt export does not read {self.describe.get(self.many, self.many)} yet")


@functools.lru_cache(maxsize=None)
def plugin_kinds() -> tuple[FolderKind, ...]:
    """Every installed plugin's kinds (loaded once); a plugin that fails to load is logged and
    left out, so the core's kinds still read."""
    kinds = []
    for ep in entry_points(group=GROUP):
        try:
            kind = ep.load()
            kinds.append(kind() if isinstance(kind, type) else kind)
        except ImportError as e:  # its framework is not installed here: its folders read as plain ones
            log.debug("fastckpt: the folder kind %s (%s) is not available: %s", ep.name, ep.value, e)
        except Exception as e:  # noqa: BLE001 - a broken plugin must not hide the other folders
            log.warning("fastckpt: the folder kind %s (%s) did not load: %s", ep.name, ep.value, e)
    return tuple(kinds)


def kind_named(survey_kind: str) -> Optional[FolderKind]:
    """The plugin kind a survey kind belongs to (None: a core kind)."""
    for kind in plugin_kinds():
        if survey_kind in (kind.many, kind.one):
            return kind
    return None


def described(survey_kind: str) -> Optional[str]:
    kind = kind_named(survey_kind)
    return kind.describe.get(survey_kind) if kind is not None else None
