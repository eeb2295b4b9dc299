"""fastckpt.dcp.saved_paths.SavedPaths on real directories and real commit records: a path saved
into again keeps its committed checkpoint until the new one is committed beside it and swapped
in; a crash between the two renames is finished by recover(); a removal waits until a save
issued after it is committed; and the non-coordinator touches no file. (The whole run of it
under a real Trainer with kills: tests/lightning_fastckpt/test_lightning_model_parallel.py.)"""
from __future__ import annotations

import concurrent.futures
import os
import zlib

from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

from fastckpt.commit import record
from fastckpt.commit_info import CommitInfo, FileEntry
from fastckpt.dcp.committed import is_committed
from fastckpt.commit.record import COMMIT_NAME as RECORD
from fastckpt.dcp.saved_paths import NEW, OLD, SavedPaths, beside, recover


def commit(folder, payload: bytes) -> None:
    """What a FastStorageWriter's finish leaves: a data file, then the record naming it."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "__0_0.distcp"), "wb") as f:
        f.write(payload)
    files = (FileEntry(name="__0_0.distcp", rank=0, bytes=len(payload), crc32=zlib.crc32(payload)),)
    record.write(CommitInfo(step=1, path=str(folder), bytes=len(payload), counter=1, time=0.0, world_size=1,
                            format="torch", files=files, meta={"dcp": True}), RECORD)


def landed() -> AsyncSaveResponse:
    done = concurrent.futures.Future()
    done.set_result(None)
    return AsyncSaveResponse(staging_completion=done, upload_completion=done)


def data(folder) -> bytes:
    with open(os.path.join(folder, "__0_0.distcp"), "rb") as f:
        return f.read()


def test_a_committed_path_saved_into_again_is_replaced_only_once_the_new_one_is_committed(tmp_path):
    last = tmp_path / "last.ckpt"
    commit(last, b"old")
    paths = SavedPaths(coordinator=True)
    into = paths.prepare(last)
    assert into == beside(last, NEW) and data(last) == b"old" and is_committed(last)  # the old one stays
    commit(into, b"new")
    paths.issued(last, into, landed())
    paths.land(last)
    assert data(last) == b"new" and is_committed(last) and sorted(os.listdir(tmp_path)) == ["last.ckpt"]


def test_an_uncommitted_path_is_withdrawn_and_written_in_place(tmp_path):
    cut = tmp_path / "cut.ckpt"
    commit(cut, b"x")
    os.remove(cut / "__0_0.distcp")  # its record names a missing file: not committed
    assert SavedPaths(coordinator=True).prepare(cut) == cut
    assert not os.path.exists(cut / RECORD)


def test_recover_finishes_a_swap_cut_between_its_renames(tmp_path):
    last = tmp_path / "last.ckpt"
    commit(beside(last, NEW), b"new")
    commit(beside(last, OLD), b"old")  # killed after `last` went aside, before the new one came in
    assert recover(last) == beside(last, NEW)
    assert data(last) == b"new" and sorted(os.listdir(tmp_path)) == ["last.ckpt"]
    commit(beside(last, OLD), b"older")  # a path in place: the siblings are leftovers
    assert recover(last) is None and data(last) == b"new" and sorted(os.listdir(tmp_path)) == ["last.ckpt"]


def test_a_removal_waits_for_a_later_committed_save_and_never_blocks(tmp_path):
    paths = SavedPaths(coordinator=True)
    first, second = tmp_path / "a.ckpt", tmp_path / "b.ckpt"
    writing = concurrent.futures.Future()  # the second save's upload, still running
    for p, response in ((first, landed()), (second, AsyncSaveResponse(landed().staging_completion, writing))):
        into = paths.prepare(p)
        commit(into, p.name.encode())
        paths.issued(p, into, response)
    paths.land(first)
    paths.remove(first)  # removed after the second save was issued: it goes once that one is committed
    assert os.path.isdir(first) and is_committed(first) and paths.finished() == []
    writing.set_result(None)
    assert paths.finished() == [str(second)]
    paths.land(second)
    paths.remove_due()
    assert not os.path.exists(first) and is_committed(second)


def test_the_other_ranks_touch_no_file(tmp_path):
    last = tmp_path / "last.ckpt"
    commit(last, b"old")
    other = SavedPaths(coordinator=False)
    assert other.prepare(last) == last and data(last) == b"old" and is_committed(last)
    other.remove(last)
    assert is_committed(last)
