"""The FolderKind seam's conformance suite (fastckpt.tools.folder_kinds, its calls numbered there),
run over every kind an installed plugin declares (`fastckpt.folders`): DeepSpeed's save folder and
tags, PyTorch DCP's checkpoint folders. A kind without a case here fails the suite.

For each kind, from a real save (a DeepSpeed engine's, dcp.save through FastStorageWriter):
(1) is_one holds for one checkpoint and not for the folder of them or an empty folder; (2) entry
says committed, with its files to check; (3) latest names one of the folder's checkpoints or none;
(4)+(5) every file checks in the kind's reading context, and a flipped byte in its largest file is
a CorruptCheckpointError; (6) full_state gives the whole state or says in one line that the kind is
not exported; the survey names the folder and the one checkpoint with the kind's own words."""
from __future__ import annotations

import os
import shutil

import pytest
import torch
import torch.distributed.checkpoint as dcp

from fastckpt.errors import ConfigError, CorruptCheckpointError
from fastckpt.tools import folder_kinds
from fastckpt.tools.folders import survey

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def deepspeed_case(base):
    pytest.importorskip("deepspeed")
    from support.deepspeed_runs import run
    run("train", base / "ck", base / "out.pt", "--stage", "1", ranks=1)
    return base / "ck", "global_step3"


def dcp_case(base):
    from fastckpt.dcp import FastStorageWriter
    for step in (1, 2):
        writer = FastStorageWriter(base / "run" / f"step-{step}", step=step, chunk_mb=1)
        dcp.save({"model": {"w": torch.randn(128, 64), "b": torch.zeros(64)}, "step": step}, storage_writer=writer)
        writer.close()
    return base / "run", "step-2"


CASES = {"DeepSpeedFolders": deepspeed_case, "DcpFolders": dcp_case}


def installed() -> list:
    folder_kinds.plugin_kinds.cache_clear()
    return list(folder_kinds.plugin_kinds())


def test_every_installed_kind_has_a_case_here():
    assert {type(k).__name__ for k in installed()} <= set(CASES), "a FolderKind without a conformance case"


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    kind = next((k for k in installed() if type(k).__name__ == request.param), None)
    if kind is None:
        pytest.skip(f"{request.param}'s plugin is not installed here")
    parent, one = CASES[request.param](tmp_path_factory.mktemp(request.param))
    return kind, parent, one


def test_1_is_one_holds_for_one_checkpoint_only(case, tmp_path):
    kind, parent, one = case
    assert kind.is_one(str(parent / one), sorted(os.listdir(parent / one)))
    assert not kind.is_one(str(parent), sorted(os.listdir(parent)))
    assert not kind.is_one(str(tmp_path), [])


def test_2_3_entry_is_committed_with_its_files_and_latest_is_one_of_them(case):
    kind, parent, one = case
    entry = kind.entry(str(parent), one, kind.latest(str(parent)))
    assert entry.status == "committed" and entry.checks, entry
    assert all(os.path.isfile(path) for path, _ in entry.checks)
    assert kind.latest(str(parent)) in (None, *os.listdir(parent))


def test_4_5_every_file_checks_and_a_flipped_byte_does_not(case, tmp_path):
    kind, parent, one = case
    copy = tmp_path / one
    shutil.copytree(parent / one, copy)
    entry = kind.entry(str(tmp_path), one, None)
    with kind.loading():
        for path, file_entry in entry.checks:
            assert kind.check(path, file_entry)
        largest, file_entry = max(entry.checks, key=lambda c: os.path.getsize(c[0]))
        with open(largest, "r+b") as f:
            f.seek(int(os.path.getsize(largest) * 0.6))
            b = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([b[0] ^ 0x40]))
        with pytest.raises(CorruptCheckpointError):
            kind.check(largest, file_entry)


def test_6_full_state_is_the_whole_state_or_a_one_line_refusal(case):
    kind, parent, one = case
    try:
        state, which = kind.full_state(str(parent))
    except ConfigError as e:
        assert "fastckpt export does not read" in str(e) and "\n" not in str(e)
        return
    assert isinstance(state, dict) and state and os.path.basename(which) == one


def test_the_survey_names_the_folder_and_the_one_checkpoint_in_the_kinds_words(case):
    kind, parent, one = case
    many, single = survey(str(parent)), survey(str(parent / one))
    assert (many.kind, single.kind) == (kind.many, kind.one) and single.single
    assert folder_kinds.described(kind.many) and folder_kinds.described(kind.one)
    assert one in [e.name for e in many.entries]
