"""DeepSpeed's tags mirrored in a bucket (the "fastckpt" entry's "bucket": fastckpt.store.s3.folder_mirror),
against a real S3 server: each tag, once committed in save_dir, is uploaded from that committed copy in
the background, its record PUT after every rank's objects, `latest` moved to it; a node whose save_dir
is gone resumes from the bucket bit-exact (real deepspeed.initialize, 2 gloo ranks); a tag of the
bucket with an object missing is passed over for the next newest, with a warning naming the object;
a failed upload is raised at the next save and the tag stays committed locally; retention and the
leftovers of a killed writer."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import uuid

import pytest
import torch

import fastckpt
from fastckpt.commit.agreement import Agreement
from fastckpt.settings import CheckpointerConfig
from fastckpt.store.s3.client import Bucket
from fastckpt.store.s3.folder_mirror import FolderMirror
from fastckpt.store.s3.place import S3Place
from fastckpt.store.url_files import Remote
from support.deepspeed_runs import assert_resumed_exactly, run


def objects(url: str) -> dict[str, bytes]:
    place = S3Place.parse(url)
    bucket = Bucket(place)
    base = place.key("")
    return {o.key[len(base):]: o for o in bucket.listing(base)}


def test_a_node_that_lost_its_save_dir_resumes_from_the_bucket_bit_exact(s3_env, tmp_path):
    pytest.importorskip("deepspeed")
    url = f"s3://{s3_env.bucket}/ds-{uuid.uuid4().hex[:8]}"
    entry = json.dumps({"concurrency": 2, "chunk_mb": 1, "bucket": url})
    save_dir = tmp_path / "ck"
    trained = run("train", save_dir, tmp_path / "a.pt", "--stage", "3", ranks=2, timeout=300, FASTCKPT_ENTRY=entry)
    local = sorted(n for n in os.listdir(save_dir / "global_step3") if n.endswith(".pt"))
    assert len(local) == 4  # ZeRO-3: each rank's model states and optimizer partition
    held = objects(url)
    assert sorted(held) == sorted([f"global_step3/{n}" for n in local] + ["global_step3/COMMIT", "latest"])
    assert Bucket(S3Place.parse(url)).get_bytes(S3Place.parse(url).key("latest"), 100) == b"global_step3"

    shutil.rmtree(save_dir)  # the node's disk is gone: the bucket is all there is
    resumed = run("resume", save_dir, tmp_path / "b.pt", "--stage", "3", ranks=2, timeout=300, FASTCKPT_ENTRY=entry)
    assert_resumed_exactly(trained, resumed)
    assert resumed["path"] is not None and os.sep + "global_step3" + os.sep in resumed["path"]
    assert sorted(n for n in os.listdir(save_dir / "global_step3") if n.endswith(".pt")) == local
    from deepspeed_fastckpt.tag_records import tag_status, file_size
    assert tag_status(str(save_dir), "global_step3", file_size)[0] == "committed"  # fetched, then its record


# -- the mirror itself, one process: a tag committed by the DeepSpeed engine's own committer ---------------
def mirror_of(url: str, endpoint=None, **kw) -> FolderMirror:
    config = CheckpointerConfig(chunk_mb=1, endpoint=endpoint)
    return FolderMirror(url, Remote.of(config), config, **kw)


def tags_into(save_dir, mirror, steps) -> None:
    from fastckpt.named import NamedCheckpoints
    from deepspeed_fastckpt.tags import TagCommitter
    named = NamedCheckpoints.by_path({"chunk_mb": 1})
    tags = TagCommitter(named, committed=mirror.drain, newest_in_bucket=mirror.newest_counter)  # as the engine
    for step in steps:
        folder = os.path.join(save_dir, f"global_step{step}")
        os.makedirs(folder, exist_ok=True)
        files = [(os.path.join(folder, name), named.save({"w": torch.full((50_000,), float(step)), "name": name},
                                                         os.path.join(folder, name), step))
                 for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt")]
        tags.submit_tag(str(save_dir), f"global_step{step}", files, step=step)
        tags.wait()
        mirror.wait()  # each uploaded before the next is saved (else the newer goes instead)
    tags.close()
    named.close()
    mirror.wait()


def test_a_tag_with_an_object_missing_or_damaged_is_passed_over_for_the_next_newest(s3_env, tmp_path):
    """Tag 3 lost an object; tag 2's object had a byte flipped where the server cannot see it (its record
    names the damaged object's ETag, so only the CRCs can tell): a node without them fetches tag 1,
    with a warning naming both."""
    from fastckpt.commit import record as commit
    from deepspeed_fastckpt.load_tag import agreed_choice
    from deepspeed_fastckpt.tag_records import file_size
    url = f"s3://{s3_env.bucket}/ds-{uuid.uuid4().hex[:8]}"
    mirror = mirror_of(url)
    tags_into(tmp_path / "a", mirror, (1, 2, 3))
    assert [os.path.basename(i.path) for i in mirror.committed()] == ["global_step3", "global_step2", "global_step1"]
    place, optim = S3Place.parse(url), "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    bucket = Bucket(place)
    bucket.delete([place.key("global_step3", optim)])
    raw = bytearray(bucket.get_bytes(place.key("global_step2", optim), 1 << 30))
    raw[len(raw) // 2] ^= 0x01
    etag = bucket.put_bytes(place.key("global_step2", optim), bytes(raw))
    info = commit.parse(bucket.get_bytes(place.key("global_step2", "COMMIT"), 1 << 20), f"{url}/global_step2/COMMIT")
    info = dataclasses.replace(info, files=tuple(dataclasses.replace(f, etag=etag) if f.name == optim else f
                                                 for f in info.files))
    bucket.delete([place.key("global_step2", "COMMIT")])
    commit.write_with(info, lambda data: bucket.put_bytes(place.key("global_step2", "COMMIT"), data))

    fresh = str(tmp_path / "b")  # another node: nothing local
    choice = agreed_choice(Agreement(), fresh, None, file_size, mirror=mirror)
    assert choice.tag == "global_step1", choice
    assert f"{url}/global_step3" in choice.warning and f"{url}/global_step2/{optim}" in choice.warning, choice.warning
    loaded = torch.load(os.path.join(fresh, "global_step1", optim), weights_only=True)
    assert torch.equal(loaded["w"], torch.full((50_000,), 1.0))
    assert not os.path.exists(os.path.join(fresh, "global_step2", optim))  # a damaged file never lands
    mirror.close()


def test_a_save_dir_holding_an_older_tag_fetches_the_buckets_newer_one(s3_env, tmp_path):
    from deepspeed_fastckpt.load_tag import agreed_choice
    from deepspeed_fastckpt.tag_records import file_size
    mirror = mirror_of(f"s3://{s3_env.bucket}/ds-{uuid.uuid4().hex[:8]}")
    tags_into(tmp_path / "a", mirror, (1, 2))
    shutil.copytree(tmp_path / "a" / "global_step1", tmp_path / "c" / "global_step1")  # a node that missed tag 2
    choice = agreed_choice(Agreement(), str(tmp_path / "c"), None, file_size, mirror=mirror)
    assert choice.tag == "global_step2" and not choice.warning, choice
    loaded = torch.load(tmp_path / "c" / "global_step2" / "mp_rank_00_model_states.pt", weights_only=True)
    assert torch.equal(loaded["w"], torch.full((50_000,), 2.0))
    # the tag committed in save_dir is as new as any the bucket can give: loaded from there
    choice = agreed_choice(Agreement(), str(tmp_path / "a"), None, file_size, mirror=mirror)
    assert choice.tag == "global_step2" and not choice.warning, choice
    mirror.close()


def test_a_new_run_into_the_prefix_numbers_its_tags_above_the_buckets(s3_env, tmp_path):
    """A run with a fresh save_dir saving into a prefix an earlier run filled: its tags are counted
    above the bucket's, so its tag of a name the bucket holds replaces that one and is the newest."""
    from fastckpt.commit import record as commit
    url = f"s3://{s3_env.bucket}/ds-{uuid.uuid4().hex[:8]}"
    mirror = mirror_of(url)
    tags_into(tmp_path / "first", mirror, (1, 2))
    tags_into(tmp_path / "second", mirror, (1,))
    assert commit.read(str(tmp_path / "second" / "global_step1"), every_rank=False).counter == 3
    newest = mirror.committed()
    assert [(os.path.basename(i.path), i.counter) for i in newest] == [("global_step1", 3), ("global_step2", 2)]
    place = S3Place.parse(url)
    assert Bucket(place).get_bytes(place.key("latest"), 100) == b"global_step1"
    mirror.close()


def test_a_failed_upload_is_raised_and_the_tag_stays_committed_locally(s3_env, tmp_path):
    """The server answers every PUT with 503 SlowDown (tests/support/s3_faults.py, the real server
    behind): the upload retries a bounded number of times, fails, is aborted and its objects deleted;
    the failure is raised, and the tag stays committed in save_dir."""
    from support.s3_faults import S3Faults
    from deepspeed_fastckpt.tag_records import file_size, tag_status
    url = f"s3://{s3_env.bucket}/ds-{uuid.uuid4().hex[:8]}"
    faults = S3Faults(s3_env.endpoint).start()
    try:
        faults.storm = True
        mirror = mirror_of(url, endpoint=faults.endpoint)
        with pytest.raises(fastckpt.CheckpointWriteError, match="upload of 'global_step1'"):
            tags_into(tmp_path, mirror, (1,))
        mirror.close()
        assert faults.refused > 1  # retried, then gave up
    finally:
        faults.stop()
    assert tag_status(str(tmp_path), "global_step1", file_size)[0] == "committed"
    assert mirror.stats["failed"] == 1 and objects(url) == {}
    place = S3Place.parse(url)
    assert Bucket(place).uploads(place.key("")) == []


def test_retention_keeps_the_newest_and_a_killed_writers_leftovers_are_swept(s3_env, tmp_path):
    url = f"s3://{s3_env.bucket}/ds-{uuid.uuid4().hex[:8]}"
    place = S3Place.parse(url)
    bucket = Bucket(place)
    bucket.put_bytes(place.key("global_step0", "mp_rank_00_model_states.pt"), b"half of a dead writer's tag")
    begun = bucket.control.create_multipart_upload(Bucket=place.bucket, Key=place.key("global_step9", "x.pt"))
    mirror = mirror_of(url, keep=1)
    tags_into(tmp_path, mirror, (1, 2))
    mirror.close()  # every upload and its retention done
    assert sorted(objects(url)) == ["global_step2/COMMIT", "global_step2/mp_rank_00_model_states.pt",
                                    "global_step2/zero_pp_rank_0_mp_rank_00_optim_states.pt", "latest"]
    assert not [u for u in bucket.uploads(place.key("")) if u.upload_id == begun["UploadId"]]
    assert mirror.stats["uploaded"] == 2 and mirror.stats["swept"] >= 2


@pytest.mark.parametrize("entry,said", [
    ({"bucket": "gs://ckpt/ds7"}, "must be an s3:// URL"),
    ({"bucket": "s3://"}, "bucket"),
    ({"bucket_keep": 2}, 'needs "bucket"'),
    ({"bucket": "s3://ckpt/ds7", "bucket_keep": -1}, "whole number"),
    ({"bucket": "s3://ckpt/ds7", "pool": "/dev/shm/pool"}, "cannot be combined"),
])
def test_a_bad_bucket_entry_is_refused_in_one_line(entry, said):
    from deepspeed_fastckpt.settings import checkpointer_config
    with pytest.raises(fastckpt.ConfigError, match=said) as e:
        checkpointer_config(entry)
    assert "\n" not in str(e.value)
