"""One writer of commit records: no module but fastckpt/commit/record.py encodes one (a grep over
the packages' sources), and every kind of checkpoint's record — a root's COMMIT, a URL's marker, a
set of files — decodes as that one format."""
from __future__ import annotations

import os
import re

import pytest
import torch

from fastckpt import Checkpointer
from fastckpt.commit import record as commit
from fastckpt.named import NamedCheckpoints
from support.paths import ROOT

ENCODES = re.compile(r"\b(commit|record)\.encode\(|import[^\n]*\bencode\b")


def test_no_module_but_the_record_module_encodes_a_commit_record():
    writers = []
    for pkg in ("fastckpt", "lightning_fastckpt", "deepspeed_fastckpt"):
        for d, _, names in os.walk(os.path.join(ROOT, pkg)):
            for n in (n for n in names if n.endswith(".py")):
                path = os.path.join(d, n)
                if path != os.path.join(ROOT, "fastckpt", "commit", "record.py") and ENCODES.search(open(path).read()):
                    writers.append(os.path.relpath(path, ROOT))
    assert writers == [], f"commit records encoded outside fastckpt/commit/record.py: {writers}"
    assert ENCODES.search("x = commit.encode(info)")  # the pattern finds what it looks for


def test_a_root_commit_and_a_url_marker_are_the_same_record(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    with Checkpointer(tmp_path / "root") as ck:
        info = ck.save({"w": torch.ones(100)}, step=1).wait()
    assert commit.read(info.path) == info
    named = NamedCheckpoints.by_path({})
    named.save({"w": torch.ones(100)}, "memory://one-record/last.ckpt", step=1).wait()
    named.close()
    fs = fsspec.filesystem("memory")
    raw = fs.cat("memory://one-record/last.ckpt.fastckpt-commit")
    marker = commit.decode(raw, "memory://one-record/last.ckpt.fastckpt-commit")
    (entry,) = marker.files
    assert entry.name == "last.ckpt" and entry.bytes == len(fs.cat("memory://one-record/last.ckpt"))
    assert entry.spans and marker.format == "torch"
    fs.rm("memory://one-record", recursive=True)
