"""DeepSpeed loads through fastckpt: every rank loads the same tag, agreed once every save of
the process into that directory has landed; a checkpoint another engine wrote loads as
DeepSpeed would load it (and a warning says it was not checked); a tag fastckpt never
finished is never loaded. Real deepspeed.initialize engines, 2 gloo ranks."""
from __future__ import annotations

import os
import shutil

import pytest
import torch

import fastckpt

from support.deepspeed_runs import assert_resumed_exactly, run
from support.paths import FIXTURES

pytest.importorskip("deepspeed")


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_load_right_after_a_save_loads_the_same_tag_on_every_rank(tmp_path, stage):
    """DeepSpeed's TestZeROSaveLoadEdgeCase::test_immediate_save_load: only rank 0 writes the
    commit record, so a rank that looked for it by itself could find nothing and skip the load
    while rank 0 loaded (under ZeRO-3: rank 0 then waits in an all-gather for ever)."""
    got = run("immediate", tmp_path / "ck", tmp_path / "a.pt", "--stage", str(stage), ranks=2, timeout=240)
    paths = got["loaded_by_rank"]  # each rank's own file (ZeRO-3: one per rank) of the same tag
    assert None not in paths and len({os.path.dirname(p) for p in paths}) == 1, paths
    assert os.path.basename(os.path.dirname(paths[0])) == "global_step1"


@pytest.mark.parametrize("stage", [1, 3])
def test_a_second_engine_loads_the_first_engines_checkpoint_still_in_flight(tmp_path, stage, fault_shim):
    """DeepSpeed's TestLatestCheckpoint::test_existing_latest: engine B, made in the same process
    right after engine A's save returned, must wait for that save and load it. A's writes are held
    (the LD_PRELOAD shim) until rank 0's load waits for them, so its save is surely still in flight
    then; had the load not waited, it would hang (the run's deadline) or load something else."""
    released = tmp_path / "released"
    held = {"LD_PRELOAD": fault_shim, "FASTCKPT_FAULT_PATH": os.path.join(tmp_path / "ck" / "global_step3", ""),
            "FASTCKPT_FAULT_HOLD": str(released)}  # the tag's files (not the folders the training thread makes)
    got = run("two-engines", tmp_path / "ck", tmp_path / "a.pt", "--stage", str(stage), ranks=2, timeout=180, **held)
    assert released.exists()  # the writes were let go by the waiting load
    assert got["path"] is not None and os.sep + "global_step3" + os.sep in got["path"]
    assert got["client"] == {"data_pos": 3, "note": "engine A"}
    for name, value in got["params_at_save"].items():
        assert torch.equal(value, got["params_loaded"][name]), name


@pytest.mark.parametrize("stage,tag", [(1, None), (3, None), (2, "global_step3")])
def test_a_checkpoint_deepspeed_wrote_itself_loads_as_deepspeed_would(tmp_path, stage, tag):
    """A run that switches to fastckpt resumes from what DeepSpeed's own engine saved: its
    `latest` (or the tag asked for) loads, bit-exact, with a warning that it had no record."""
    trained = run("train", tmp_path / "ck", tmp_path / "a.pt", "--stage", str(stage), "--engine", "torch", ranks=2)
    extra = ("--tag", tag) if tag else ()
    resumed = run("resume", tmp_path / "ck", tmp_path / "b.pt", "--stage", str(stage), *extra, ranks=2)
    assert_resumed_exactly(trained, resumed)
    assert any("no fastckpt commit record" in w for w in resumed["warnings"]), resumed["warnings"]


@pytest.mark.parametrize("stage", [1, 3])
def test_a_universal_checkpoint_made_from_a_fastckpt_save_loads(tmp_path, stage, fault_shim):
    """DeepSpeed's TestZeROUniversalCheckpointDP::test_dp_world_size_2to2: ds_to_universal runs on
    rank 0 right after save_checkpoint returned, so it must wait for the save still in flight
    (its writes held by the shim until ds_to_universal waits for them, so that it surely is); it
    copies the model-state files fastckpt wrote into a tag fastckpt never saved, which was refused
    as a save cut short."""
    released = tmp_path / "released"
    held = {"LD_PRELOAD": fault_shim, "FASTCKPT_FAULT_PATH": os.path.join(tmp_path / "ck" / "t", ""),
            "FASTCKPT_FAULT_HOLD": str(released)}
    got = run("universal", tmp_path / "ck", tmp_path / "a.pt", "--stage", str(stage), ranks=2, timeout=180, **held)
    assert released.exists()
    assert got["path"] is not None and os.sep + "t_universal" + os.sep in got["path"], got["path"]
    assert got["client"] == {"data_pos": 3, "note": "universal"}
    for name, value in got["params_at_save"].items():
        assert torch.equal(value, got["params_loaded"][name]), name
    assert any("no fastckpt commit record" in w for w in got["warnings"]), got["warnings"]
    assert (tmp_path / "ck" / "t" / "fastckpt-tag.open").exists()
    assert not (tmp_path / "ck" / "t_universal" / "fastckpt-tag.open").exists()


def test_a_tag_fastckpt_began_is_told_from_files_copied_into_another(tmp_path):
    """The same complete fastckpt file: in a tag a fastckpt save opened and never committed it is
    torn (never loaded); copied into a tag no fastckpt save opened it is another writer's."""
    from deepspeed_fastckpt.tag_records import file_size, mark_open, tag_status
    for tag in ("begun", "copied"):
        (tmp_path / tag).mkdir()
        fastckpt.save({"w": torch.ones(3)}, tmp_path / tag / "mp_rank_00_model_states.pt")
    mark_open(str(tmp_path), "begun")
    assert tag_status(str(tmp_path), "begun", file_size)[0] == "torn"
    assert tag_status(str(tmp_path), "copied", file_size)[0] == "foreign"
    (tmp_path / "unreadable").mkdir()
    (tmp_path / "unreadable" / "COMMIT").mkdir()  # its record cannot be read: damaged, no OSError
    assert tag_status(str(tmp_path), "unreadable", file_size)[0] == "damaged"


def test_deepspeeds_latest_is_named_again_durably_once_a_tag_commits_never_going_back(tmp_path):
    """DeepSpeed writes `latest` in place with a plain open(): after a power loss it may name an
    older tag than the newest committed (the simulator found a resume going back two steps).
    Once a tag commits, `latest` is written again atomically — unless it already names a newer
    committed tag; a name that is no committed tag (one in flight, torn bytes) is replaced."""
    from fastckpt.commit import record
    from fastckpt.commit.record import CommitInfo
    from deepspeed_fastckpt.tag_records import name_in_deepspeeds_latest, read_latest
    for counter, tag in ((1, "global_step1"), (2, "global_step2")):
        (tmp_path / tag).mkdir()
        record.write(CommitInfo(step=counter, path=str(tmp_path / tag), bytes=0, counter=counter, time=0.0,
                                world_size=1, format="torch"))
    (tmp_path / "latest").write_text("global_step2")
    name_in_deepspeeds_latest(str(tmp_path), "global_step1", 1)  # an older tag landing late
    assert read_latest(str(tmp_path), "latest") == "global_step2"
    (tmp_path / "latest").write_text("global_step1")  # what a power loss left
    name_in_deepspeeds_latest(str(tmp_path), "global_step2", 2)
    assert read_latest(str(tmp_path), "latest") == "global_step2"
    for left in ("global_st", "global_step3"):  # torn, or a tag still in flight
        (tmp_path / "latest").write_text(left)
        name_in_deepspeeds_latest(str(tmp_path), "global_step2", 2)
        assert read_latest(str(tmp_path), "latest") == "global_step2"


def test_fastckpt_latest_names_a_tag_only_once_its_record_exists(tmp_path):
    """While a tag's file is still being written, and after that tag failed, fastckpt-latest
    still names the committed tag before it; once a tag commits it names that one."""
    from fastckpt.named import NamedCheckpoints
    from fastckpt.pending import Pending
    from deepspeed_fastckpt.tag_records import LATEST
    from deepspeed_fastckpt.tags import TagCommitter
    named = NamedCheckpoints.by_path({})
    tags = TagCommitter(named)
    latest = tmp_path / LATEST

    def save(tag: str) -> list:
        path = str(tmp_path / tag / "mp_rank_00_model_states.pt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return [(path, named.save({"w": torch.ones(100)}, path, 1))]

    tags.submit_tag(str(tmp_path), "global_step1", save("global_step1"), step=1)
    tags.wait()
    assert latest.read_text() == "global_step1"
    held = Pending(2, 2)  # the tag's file, still being written
    tags.submit_tag(str(tmp_path), "global_step2", [(str(tmp_path / "global_step2" / "x.pt"), held)], step=2)
    assert latest.read_text() == "global_step1"
    held.settle(None, OSError("no space left on device"))
    with pytest.raises(fastckpt.CheckpointWriteError):
        tags.wait()
    assert latest.read_text() == "global_step1"
    tags.submit_tag(str(tmp_path), "global_step3", save("global_step3"), step=3)
    tags.wait()
    assert latest.read_text() == "global_step3"
    tags.close()
    named.close()


def test_nothing_to_load_is_said_not_silent(tmp_path):
    (tmp_path / "ck").mkdir()
    got = run("resume-nothing", tmp_path / "ck", tmp_path / "a.pt", "--stage", "1")
    assert got["path"] is None
    assert any("nothing was loaded" in w for w in got["warnings"]), got["warnings"]


def test_a_deepspeed_tag_record_of_0_1_is_committed_with_its_seq_as_counter(tmp_path, capsys):
    """tests/fixtures/v0_1/deepspeed: 0.1's tag record (plain JSON, no CRC of its own) reads as a
    commit record whose counter is its `seq`; its files' sizes are still checked; `fastckpt ls`
    and `verify` read the folder."""
    from deepspeed_fastckpt.tag_records import file_size, newest_committed_tag, newest_counter, read_record, tag_status
    save_dir = str(shutil.copytree(os.path.join(FIXTURES, "v0_1", "deepspeed"), tmp_path / "ds"))
    info = read_record(save_dir, "global_step3")
    assert info.counter == 1 and info.world_size == 1
    assert sorted(f.name for f in info.files) == ["mp_rank_00_model_states.pt",
                                                  "zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    assert tag_status(save_dir, "global_step3", file_size) == ("committed", "")
    assert newest_committed_tag(save_dir) == "global_step3" and newest_counter(save_dir) == 1
    with open(os.path.join(save_dir, "global_step3", "mp_rank_00_model_states.pt"), "ab") as f:
        f.write(b"\0")  # its sizes are still checked
    assert tag_status(save_dir, "global_step3", file_size)[0] == "damaged"
    from fastckpt.tools.cli import main
    shutil.rmtree(save_dir)
    save_dir = os.path.join(FIXTURES, "v0_1", "deepspeed")
    assert main(["ls", save_dir]) == 0 and "committed" in capsys.readouterr().out
    assert main(["verify", save_dir]) == 0
    out = capsys.readouterr().out
    assert "CORRUPT" not in out and "ok" in out, out


def test_a_tag_fastckpt_0_1_committed_resumes_and_the_next_tag_commits_after_it(tmp_path):
    """tests/fixtures/v0_1/deepspeed: 0.1's tag record (plain JSON, a seq) is a committed tag: a real
    engine resumes from it without a warning, and a tag saved into the same folder afterwards gets
    the record of this version with the next counter."""
    from deepspeed_fastckpt.tag_records import read_record
    save_dir = shutil.copytree(os.path.join(FIXTURES, "v0_1", "deepspeed"), tmp_path / "ck")
    got = run("resume", save_dir, tmp_path / "a.pt", "--stage", "1", WIDTH="8")
    assert got["loaded_steps"] == 3 and got["client"] == {"data_pos": 3, "note": "three steps"}
    assert got["warnings"] == [] and got["path"].endswith(os.path.join("global_step3", "mp_rank_00_model_states.pt"))
    run("train", save_dir, tmp_path / "b.pt", "--stage", "1", WIDTH="8")  # global_step3 again, over 0.1's
    info = read_record(str(save_dir), "global_step3")
    assert info.counter == 2 and {f.rank for f in info.files} == {0} and info.meta == {"tag": "global_step3"}
    assert info.step == 3  # DeepSpeed's global_steps, as its model-states file records them
    assert b'"body"' in (save_dir / "global_step3" / "COMMIT").read_bytes()  # this version's record
    assert not (save_dir / "global_step3" / "fastckpt-tag.json").exists()  # 0.1's, superseded
