"""DeepSpeed's folders as `fastckpt ls` and `fastckpt verify` read them: a save folder of tags,
and one tag — the plugin's FolderKind (fastckpt.tools.folder_kinds), named in setup.cfg's
entry points `fastckpt.folders`. What a tag's status means: deepspeed_fastckpt.tag_records.
"""
from __future__ import annotations

import os
import re
from typing import Optional

import torch

from fastckpt.session import Entry, FolderKind, file_size

from .safe_types import deepspeed_safe_globals
from .tag_records import EARLIER_RECORD, LATEST, TAG_OPEN, read_latest, read_record, tag_status

FILE_RE = re.compile(r"(model_states|optim_states)\.pt$")  # what DeepSpeed's engine names its files
STEP_RE = re.compile(r"global_step(\d+)")  # DeepSpeed's default tag names the step
STATUS = {"torn": "incomplete", "damaged": "invalid", "empty": "incomplete", "missing": "incomplete"}


class DeepSpeedFolders(FolderKind):
    many, one = "deepspeed", "tag"
    describe = {"deepspeed": "a DeepSpeed save folder", "tag": "one DeepSpeed tag"}

    def is_one(self, path: str, names: list[str]) -> bool:
        return TAG_OPEN in names or EARLIER_RECORD in names or any(FILE_RE.search(n) for n in names)

    def latest(self, path: str) -> Optional[str]:
        return read_latest(path, "latest") or read_latest(path, LATEST)

    def entry(self, parent: str, name: str, latest: Optional[str]) -> Entry:
        tag_dir = os.path.join(parent, name)
        status, why = tag_status(parent, name, file_size)
        entry = Entry(name, tag_dir, STATUS.get(status, status), detail=why, time=os.path.getmtime(tag_dir),
                      latest=name == latest)
        named = STEP_RE.fullmatch(name)
        entry.step = int(named.group(1)) if named else None
        if status == "committed":
            info = read_record(parent, name)
            n = info.world_size
            entry.detail = f"commit {info.counter}, {n} rank{'s' if n > 1 else ''}"
            entry.checks = [(os.path.join(tag_dir, f.name), f) for f in info.files]
        else:
            entry.checks = [(os.path.join(tag_dir, n), None) for n in sorted(os.listdir(tag_dir)) if FILE_RE.search(n)]
        entry.bytes = sum(file_size(p) or 0 for p, _ in entry.checks)
        return entry

    def loading(self):
        """DeepSpeed's files name a few of its plain-data types, which its engine allows when it
        loads them: judged the same way here."""
        return torch.serialization.safe_globals(deepspeed_safe_globals())
