"""A plugin's kinds of folder reach `fastckpt ls` through the entry-point group `fastckpt.folders`:
DeepSpeed's is declared there; a plugin that fails to load is said and left out, and the core's
own kinds still read."""
from __future__ import annotations

import logging

import pytest
import torch

import fastckpt
from fastckpt.tools import folder_kinds
from fastckpt.tools.folders import survey


class Broken:
    name, value = "broken", "nowhere:Kind"

    def load(self):
        raise RuntimeError("its kind cannot be built")


class NotInstalled(Broken):
    name, value = "absent", "absent_plugin:Kind"

    def load(self):
        raise ImportError("No module named 'absent_framework'")


def test_deepspeed_declares_its_folders_when_it_is_installed():
    pytest.importorskip("deepspeed")
    folder_kinds.plugin_kinds.cache_clear()
    kinds = {type(k).__name__: k for k in folder_kinds.plugin_kinds()}
    assert "DeepSpeedFolders" in kinds, kinds
    assert folder_kinds.kind_named("tag") is kinds["DeepSpeedFolders"]
    assert folder_kinds.described("deepspeed") == "a DeepSpeed save folder"


def test_a_plugin_that_fails_to_load_is_said_and_the_core_kinds_still_read(tmp_path, monkeypatch, caplog):
    """A plugin whose framework is not installed is left out quietly; one that breaks is said."""
    monkeypatch.setattr(folder_kinds, "entry_points", lambda group: [NotInstalled(), Broken()])
    folder_kinds.plugin_kinds.cache_clear()
    try:
        fastckpt.save({"w": torch.ones(4)}, tmp_path / "last.ckpt")
        with caplog.at_level(logging.WARNING, logger="fastckpt"):
            found = survey(str(tmp_path))
        assert found.kind == "files" and [e.name for e in found.entries] == ["last.ckpt"]
        assert "broken" in caplog.text and "its kind cannot be built" in caplog.text
        assert "absent" not in caplog.text
    finally:
        folder_kinds.plugin_kinds.cache_clear()
