"""Where a DCP run resumes from (fastckpt.dcp.newest_committed), in a folder that holds checkpoints
of both writers: DCP's own FileSystemWriter (a run from before the switch) and FastStorageWriter.
The newest usable step wins whoever wrote it; one picked from DCP's writer says so in one warning;
a truncated rank file, an empty or cut-short folder and fastckpt's uncommitted one are passed
over with a warning naming each; nothing usable is None, with a warning, and FastStorageReader(None)
says in one line that there is nothing to read. The commit record's step is the folder's number
when none is given. The CLI's export picks the same checkpoint."""
from __future__ import annotations

import os
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

from fastckpt.dcp import FastStorageReader, FastStorageWriter, Resumable, committed, newest_committed, resumable
from fastckpt.dcp.folders import DcpFolders
from fastckpt.errors import NoCheckpointError

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def state(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g), "step": step}


def stock_save(folder, step: int) -> str:
    path = os.path.join(folder, f"step-{step}")
    dcp.save(state(step), checkpoint_id=path)  # DCP's own FileSystemWriter
    return path


def fast_save(folder, step: int) -> str:
    path = os.path.join(folder, f"step-{step}")
    writer = FastStorageWriter(path)
    dcp.save(state(step), storage_writer=writer)
    writer.close()
    return path


def loaded(path) -> dict:
    target = {"w": torch.zeros(64, 32), "b": torch.zeros(32), "step": -1}
    dcp.load(target, storage_reader=FastStorageReader(path))
    return target


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if isinstance(b[k], torch.Tensor) else a[k] == b[k]
                                        for k in b)


def newest_warned(folder):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        newest = newest_committed(folder)
    return newest, [str(w.message) for w in caught if "fastckpt" in str(w.message)]


def test_a_folder_of_stock_checkpoints_resumes_from_its_newest_step_with_one_warning(tmp_path):
    for step in (1, 2, 3):
        stock_save(tmp_path, step)
    newest, said = newest_warned(tmp_path)
    assert isinstance(newest, Resumable) and (newest.step, newest.by) == (3, "dcp")
    assert newest.path == os.fspath(tmp_path / "step-3") == os.fspath(newest) == str(newest)
    assert len(said) == 1 and "DCP's own writer" in said[0] and "step 3" in said[0]
    assert same(loaded(newest), state(3))
    assert committed(tmp_path) == []  # fastckpt committed none of them


def test_the_newest_step_wins_whoever_wrote_it(tmp_path):
    stock_save(tmp_path, 1)
    fast_save(tmp_path, 2)
    stock_save(tmp_path, 3)
    assert (newest_committed(tmp_path).step, newest_committed(tmp_path).by) == (3, "dcp")
    fast_save(tmp_path, 4)
    newest, said = newest_warned(tmp_path)
    assert (newest.step, newest.by) == (4, "fastckpt") and said == []
    assert [(r.step, r.by) for r in resumable(tmp_path)[0]] == [(4, "fastckpt"), (3, "dcp"), (2, "fastckpt"),
                                                                (1, "dcp")]
    assert [info.step for info in committed(tmp_path)] == [4, 2]  # the record's step: the folder's number
    assert same(loaded(newest), state(4))


def test_a_truncated_rank_file_and_cut_short_folders_are_passed_over_by_name(tmp_path):
    stock_save(tmp_path, 1)
    fast_save(tmp_path, 2)
    torn = stock_save(tmp_path, 3)
    data = [n for n in os.listdir(torn) if n.endswith(".distcp")][0]
    os.truncate(os.path.join(torn, data), os.path.getsize(os.path.join(torn, data)) // 2)
    os.makedirs(tmp_path / "step-4")  # a save killed after its mkdir
    uncommitted = fast_save(tmp_path, 5)
    os.unlink(os.path.join(uncommitted, "COMMIT"))  # killed before its commit record
    newest, said = newest_warned(tmp_path)
    assert (newest.step, newest.by) == (2, "fastckpt")
    assert len(said) == 1
    for name, why in (("step-3", "truncated"), ("step-4", "cut short"), ("step-5", "never committed")):
        assert name in said[0] and why in said[0], said
    assert "resuming from" in said[0] and "step 2" in said[0]
    assert same(loaded(newest), state(2))
    assert DcpFolders().full_state(os.fspath(tmp_path))[1] == newest.path  # `fastckpt export` picks it too


def test_nothing_usable_is_none_said_once_and_the_reader_refuses_none_in_one_line(tmp_path):
    assert newest_warned(tmp_path) == (None, [])  # an empty folder: a fresh start, nothing to say
    os.makedirs(tmp_path / "step-7")
    newest, said = newest_warned(tmp_path)
    assert newest is None and len(said) == 1 and "step-7" in said[0] and "nothing is loaded" in said[0]
    with pytest.raises(NoCheckpointError, match="no checkpoint to read") as e:
        FastStorageReader(newest)
    assert "\n" not in str(e.value)


def test_each_save_removes_the_saves_cut_short_below_the_newest_checkpoint_and_nothing_else(tmp_path):
    """Only a folder that holds nothing but what a DCP save writes is removed, never one with
    anything else in it (a user's file), a damaged checkpoint, or one that is not a checkpoint."""
    fast_save(tmp_path, 1)
    fast_save(tmp_path, 2)
    os.makedirs(tmp_path / "step-3")  # killed after its mkdir
    (tmp_path / "step-3" / "__0_0.distcp").write_bytes(b"x" * 100)
    os.unlink(os.path.join(fast_save(tmp_path, 4), "COMMIT"))  # killed before its record
    damaged = stock_save(tmp_path, 0)  # a stock checkpoint whose file lost its tail: damaged, not cut short
    data = [n for n in os.listdir(damaged) if n.endswith(".distcp")][0]
    os.truncate(os.path.join(damaged, data), 10)
    os.makedirs(tmp_path / "notes")  # not a checkpoint at all
    os.makedirs(tmp_path / "ckpt3")  # named like one, holding something else: never touched
    (tmp_path / "ckpt3" / "mine.txt").write_text("a user's file")
    os.makedirs(tmp_path / "step-1b")  # data of a save cut short beside a user's file: kept
    (tmp_path / "step-1b" / "__0_0.distcp").write_bytes(b"x")
    (tmp_path / "step-1b" / "notes.txt").write_text("a user's file")
    fast_save(tmp_path, 5)  # the newest before it is step 2: nothing cut short lies below it
    kept = ["ckpt3", "notes", "step-0", "step-1", "step-1b", "step-2"]
    assert sorted(os.listdir(tmp_path)) == sorted(kept + ["step-3", "step-4", "step-5"])
    fast_save(tmp_path, 6)  # the newest before it is step 5: steps 3 and 4 were cut short below it
    assert sorted(os.listdir(tmp_path)) == sorted(kept + ["step-5", "step-6"])
    assert (tmp_path / "ckpt3" / "mine.txt").exists() and (tmp_path / "step-1b" / "notes.txt").exists()
    assert [r.step for r in resumable(tmp_path)[0]] == [6, 5, 2, 1]


def test_the_newest_is_a_str_its_callers_can_use_as_a_path(tmp_path):
    """An outside checker saved `newest_committed`'s answer with json.dumps and matched its name
    with .endswith: both failed on the old dataclass."""
    import json
    fast_save(tmp_path, 2)
    newest = newest_committed(tmp_path)
    assert isinstance(newest, str) and newest == str(tmp_path / "step-2") and newest.endswith("step-2")
    assert json.loads(json.dumps({"resume": newest})) == {"resume": str(tmp_path / "step-2")}
    assert (newest.step, newest.by, os.fspath(newest)) == (2, "fastckpt", str(tmp_path / "step-2"))
    assert os.path.basename(newest) == "step-2" and newest.path == newest


def test_a_stock_checkpoint_resumed_from_warns_once_though_picked_and_then_read(tmp_path):
    """docs/dcp.md promises one warning: newest_committed picking DCP's own checkpoint and
    FastStorageReader reading it (torchtitan's resume does both) say it once between them."""
    stock_save(tmp_path, 4)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        newest = newest_committed(tmp_path)
        out = {"w": torch.zeros(64, 32), "b": torch.zeros(32), "step": 0}
        dcp.load(out, storage_reader=FastStorageReader(str(newest)))  # a plain str of the same path
    about = [w for w in said if "no fastckpt commit record" in str(w.message)]
    assert len(about) == 1 and out["step"] == 4, [str(w.message) for w in about]
