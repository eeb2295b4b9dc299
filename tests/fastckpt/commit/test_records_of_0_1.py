"""Checkpoints fastckpt 0.1 wrote (tests/fixtures/v0_1, checked in) still list, verify and load:
a Checkpointer root's COMMIT record and a file uploaded to a URL with 0.1's marker. (0.1's
DeepSpeed tags: tests/deepspeed_fastckpt/test_deepspeed_load.py.)"""
from __future__ import annotations

import os
import shutil

import pytest

import torch

from fastckpt import Checkpointer
from fastckpt.errors import CorruptCheckpointError
from fastckpt.named import NamedCheckpoints
from fastckpt.tools.cli import main
from support.paths import FIXTURES

OLD = os.path.join(FIXTURES, "v0_1")


def test_a_checkpointer_root_of_0_1_loads_the_state_it_saved(tmp_path):
    root = shutil.copytree(os.path.join(OLD, "root"), tmp_path / "root")
    torch.manual_seed(0)
    expected = torch.randn(64, 8)
    with Checkpointer(root) as ck:
        info = ck.latest(verified=True)
        state = ck.load()
    assert info.step == 3 and info.counter == 1
    assert torch.equal(state["w"], expected) and state["step"] == 3 and state["note"] == "fastckpt 0.1"


def test_fastckpt_ls_and_verify_read_a_root_of_0_1(capsys):
    for folder in ("root",):
        assert main(["ls", os.path.join(OLD, folder)]) == 0
        assert "committed" in capsys.readouterr().out
        assert main(["verify", os.path.join(OLD, folder)]) == 0
        out = capsys.readouterr().out
        assert "CORRUPT" not in out and "ok" in out, out


def test_a_file_uploaded_by_0_1_loads_checked_against_its_marker():
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    for name in ("last.ckpt", "last.ckpt.fastckpt-commit"):
        with open(os.path.join(OLD, "url", name), "rb") as f:
            fs.pipe_file(f"memory://v01-test/{name}", f.read())
    torch.manual_seed(0)
    expected = torch.randn(64, 8)
    named = NamedCheckpoints.by_path({})
    state = named.load("memory://v01-test/last.ckpt")
    assert torch.equal(state["w"], expected) and state["note"] == "fastckpt 0.1"
    fs.pipe_file("memory://v01-test/last.ckpt", fs.cat("memory://v01-test/last.ckpt") + b"\0")
    with pytest.raises(CorruptCheckpointError, match="commit record says"):
        named.load("memory://v01-test/last.ckpt")
    fs.rm("memory://v01-test", recursive=True)
