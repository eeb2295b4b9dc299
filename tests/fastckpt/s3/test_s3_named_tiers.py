"""A memory tier in front of s3:// paths (fastckpt.store.named_tiers with fastckpt.store.s3.object_path
behind): Lightning's `.ckpt` in a bucket through FastCheckpointIO(tiers=[memory]), against a real S3
server. Each save commits in memory, then its copy is uploaded to the path's object through the S3
store's client, checked against its record first, and its commit record put after it; a load reads
the memory copy while the object is that save (the index notes its ETag), else the object; a removal
takes the object, its record and the memory copies. On 2 DDP ranks: training resumes bit-exact from
the bucket after the memory tier is wiped."""
from __future__ import annotations

import os
import shutil
import time
import uuid

import pytest
import torch

import fastckpt
from fastckpt.named import NamedCheckpoints
from lightning_fastckpt import FastCheckpointIO
from support.lightning_runs import losses, run
from support.states import assert_same
from workers.lit_app import assert_equal

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def state(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(300, 1000, generator=g), "step": step}


def listed(url: str) -> list[str]:
    import fsspec
    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    return sorted(n for n in (p.rsplit("/", 1)[1] for p in fs.ls(url)) if n) if fs.exists(url) else []


@pytest.fixture
def memory(shm):
    return os.path.join(shm, "memory")


def test_a_save_to_an_s3_path_lands_in_the_bucket_from_its_memory_copy(s3_env, memory, monkeypatch):
    url = f"s3://{s3_env.bucket}/named-{uuid.uuid4().hex[:8]}"
    named = NamedCheckpoints.by_path({"tiers": [memory], "tier_keep": [2]})
    for step in (1, 2):
        pending = named.save(state(step), f"{url}/last.ckpt", step)
        assert pending.wait_placed(120) and pending.placed_error is None, pending.placed_error
    assert listed(url) == ["last.ckpt", "last.ckpt.fastckpt-commit"]
    plain = NamedCheckpoints.by_path({})  # no tier: the object, checked against its record
    assert_same(state(2), plain.load(f"{url}/last.ckpt"))
    assert_same(state(2), named.load(f"{url}/last.ckpt"))  # the object is that save: read from memory
    assert named.reads[-1].tier == "memory"
    named.close()

    # a later run without the tier saves the path again: the memory copy never stands in for it
    plain.save(state(7), f"{url}/last.ckpt", 7).wait()
    plain.close()
    again = NamedCheckpoints.by_path({"tiers": [memory], "tier_keep": [2]})
    assert again.load(f"{url}/last.ckpt")["step"] == 7 and again.reads[-1].tier == "disk"

    # a removal takes the object, its record and the memory copies
    again.save(state(3), f"{url}/a.ckpt", 3).wait_placed(120)
    again.save(state(4), f"{url}/b.ckpt", 4).wait_placed(120)  # a removal waits for a newer checkpoint
    again.remove(f"{url}/a.ckpt")
    assert "a.ckpt" not in listed(url) and "a.ckpt.fastckpt-commit" not in listed(url)
    assert again._store.copies_of(f"{url}/a.ckpt") == []
    again.close()


def test_an_object_without_a_record_saved_in_the_second_of_the_memory_copy_is_read(s3_env, memory, monkeypatch):
    """Another writer's object without a commit record (Lightning's own IO), whose whole-second
    modification time (as S3 reports it) is the second the memory copy committed in: it may be the
    newer, so the object is read, never the memory copy."""
    import fsspec
    from fastckpt.store.s3.client import Bucket
    url = f"s3://{s3_env.bucket}/named-{uuid.uuid4().hex[:8]}/last.ckpt"
    named = NamedCheckpoints.by_path({"tiers": [memory]})
    assert named.save(state(2), url, 2).wait_placed(120)
    fs = fsspec.filesystem("s3")
    fs.rm(url + ".fastckpt-commit")
    with fs.open(url, "wb") as f:
        torch.save(state(7), f)
    committed = named._store.copies_of(url)[0][0].time
    real = Bucket.stamp
    monkeypatch.setattr(Bucket, "stamp", lambda self, key: dict(real(self, key), mtime_ns=int(committed) * 10**9))
    with pytest.warns(UserWarning, match="no fastckpt commit record"):
        assert named.load(url)["step"] == 7
    assert named.reads[-1].tier == "disk"
    named.close()


def test_while_a_copy_is_on_its_way_the_memory_copy_is_read(s3_env, memory, monkeypatch):
    """Between the old record's deletion and the new record, the object is the old save or the new
    one, with no record: the index's note that the copy began sends a load to the memory copy
    (the newest save), whatever the object's modification time says."""
    import threading
    from fastckpt.store.s3 import object_path
    from fastckpt.store.s3.client import Bucket
    url = f"s3://{s3_env.bucket}/named-{uuid.uuid4().hex[:8]}/last.ckpt"
    named = NamedCheckpoints.by_path({"tiers": [memory]})
    assert named.save(state(1), url, 1).wait_placed(120)
    started, go, real = threading.Event(), threading.Event(), object_path.upload_part

    def held(*a):
        started.set()
        assert go.wait(60)
        return real(*a)
    monkeypatch.setattr(object_path, "upload_part", held)
    real_stamp = Bucket.stamp  # the old object looks newer than any memory copy
    monkeypatch.setattr(Bucket, "stamp", lambda self, key: dict(real_stamp(self, key), mtime_ns=(int(time.time()) + 60) * 10**9))
    pending = named.save(state(2), url, 2)
    assert started.wait(60)  # the old record is gone, the upload not begun
    assert named.load(url)["step"] == 2 and named.reads[-1].tier == "memory"
    go.set()
    assert pending.wait_placed(120) and pending.placed_error is None
    named.close()


def test_a_damaged_memory_copy_never_reaches_the_bucket(s3_env, memory, monkeypatch):
    """The memory copy is checked against its record on the mapping the upload sends from: a
    flipped byte fails the copy naming the file, and no object (nor record) is put at the path."""
    from fastckpt.store import tier_copy
    url = f"s3://{s3_env.bucket}/named-{uuid.uuid4().hex[:8]}/last.ckpt"
    real = tier_copy.upload_part

    def flipped(bucket, key, src, entry, *a):
        with open(src, "r+b") as f:
            f.seek(entry.bytes // 2)
            byte = f.read(1)
            f.seek(entry.bytes // 2)
            f.write(bytes([byte[0] ^ 0xFF]))
        return real(bucket, key, src, entry, *a)
    monkeypatch.setattr("fastckpt.store.s3.object_path.upload_part", flipped)
    named = NamedCheckpoints.by_path({"tiers": [memory]})
    pending = named.save(state(1), url, 1)
    assert pending.wait_placed(120)
    assert isinstance(pending.placed_error, fastckpt.CorruptCheckpointError), pending.placed_error
    assert memory in str(pending.placed_error) and "fails its CRC-32 check" in str(pending.placed_error)
    with pytest.raises(fastckpt.CheckpointWriteError, match="fails its CRC-32 check"):
        named.close()
    assert listed(url.rsplit("/", 1)[0]) == []  # neither the object nor its record


def test_a_path_removed_while_its_copy_uploads_is_left_without_object_or_record(s3_env, memory, monkeypatch):
    """Lightning's top-k removes a file whose copy is still on its way: once the upload ends, the
    copy finds its path removed and deletes the object again; no record is put."""
    from fastckpt.store.s3 import object_path
    url = f"s3://{s3_env.bucket}/named-{uuid.uuid4().hex[:8]}/epoch=0.ckpt"
    named = NamedCheckpoints.by_path({"tiers": [memory]})
    real = object_path.upload_part

    def removed_meanwhile(*a):
        named._store.remove_path(url)  # as NamedCheckpoints.remove does (here on the copy's own thread), as the
        # upload starts: the upload and its record land after the removal
        etag = real(*a)
        assert url.rsplit("/", 1)[1] in listed(url.rsplit("/", 1)[0])  # uploaded after the removal
        return etag
    monkeypatch.setattr(object_path, "upload_part", removed_meanwhile)
    pending = named.save(state(1), url, 1)
    assert pending.wait_placed(120) and pending.placed_error is None, pending.placed_error
    assert listed(url.rsplit("/", 1)[0]) == []
    named.close()


def test_the_endpoint_setting_reaches_every_request_on_an_s3_path(s3_env, memory, monkeypatch):
    """endpoint= in the settings, no AWS_ENDPOINT_URL: uploads, records, loads, removals and saves
    straight to the path (after a preemption's hurry) all go to that server."""
    import obstore
    endpoint = s3_env.endpoint
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    prefix = f"named-{uuid.uuid4().hex[:8]}"
    url = f"s3://{s3_env.bucket}/{prefix}"
    named = NamedCheckpoints.by_path({"endpoint": endpoint, "tiers": [memory], "tier_keep": [3]})
    for step, name in ((1, "a"), (2, "b")):
        assert named.save(state(step), f"{url}/{name}.ckpt", step).wait_placed(120)
    named.remove(f"{url}/a.ckpt")
    named._store.hurry()  # a preemption: saves go to their paths alone
    assert named.save(state(3), f"{url}/c.ckpt", 3).wait_placed(120)
    assert named.load(f"{url}/b.ckpt")["step"] == 2 and named.reads[-1].tier == "memory"
    named.close()
    keys = sorted(o["path"].rsplit("/", 1)[1] for o in obstore.list(s3_env.store(), prefix=prefix + "/").collect())
    assert keys == ["b.ckpt", "b.ckpt.fastckpt-commit", "c.ckpt", "c.ckpt.fastckpt-commit"], keys
    plain = NamedCheckpoints.by_path({"endpoint": endpoint})
    assert plain.load(f"{url}/c.ckpt")["step"] == 3 and plain.load(f"{url}/b.ckpt")["step"] == 2
    plain.close()


def test_ddp_with_a_memory_tier_saves_to_a_bucket_and_resumes_from_it_bit_exact(s3_env, tmp_path, memory):
    """save_top_k=1 through FastCheckpointIO(tiers=[memory]) on 2 DDP ranks: the bucket holds the
    newest epoch's file and last.ckpt, each equal to a synchronous torch.save of the same dict; the
    memory tier is wiped and training resumes from the bucket, bit-exact."""
    url = f"s3://{s3_env.bucket}/lit-tiers-{uuid.uuid4().hex[:8]}"
    run(tmp_path / "whole", "--epochs", "3", ddp=True)
    run(tmp_path / "s3", "--epochs", "2", "--ck", url, "--top-k", "1", "--tiers", memory, ddp=True)
    assert listed(url) == ["epoch=1-step=8.ckpt", "epoch=1-step=8.ckpt.fastckpt-commit", "last.ckpt",
                           "last.ckpt.fastckpt-commit"], listed(url)
    io = FastCheckpointIO()
    for name in ("epoch=1-step=8.ckpt", "last.ckpt"):
        got = io.load_checkpoint(f"{url}/{name}")  # the object, checked against its record
        want = torch.load(tmp_path / "s3" / "sync" / f"step-{got['global_step']}.pt", weights_only=True)
        assert_equal({"state_dict": got["state_dict"], "optimizer_states": got["optimizer_states"]}, want)
    io.teardown()
    assert any(n.startswith("step-") for n in os.listdir(os.path.join(memory, "rank-0")))  # committed there first
    shutil.rmtree(memory)  # a new node: nothing local
    run(tmp_path / "s3", "--epochs", "3", "--ck", url, "--top-k", "1", "--tiers", memory,
        "--resume-from", f"{url}/last.ckpt", ddp=True)
    assert torch.load(tmp_path / "s3" / "loaded-rank0.pt", weights_only=True)["global_step"] == 8
    assert losses(tmp_path / "s3") == losses(tmp_path / "whole")
    assert_equal(torch.load(tmp_path / "s3" / "final-rank0.pt"), torch.load(tmp_path / "whole" / "final-rank0.pt"))
    assert listed(url) == ["epoch=2-step=12.ckpt", "epoch=2-step=12.ckpt.fastckpt-commit", "last.ckpt",
                           "last.ckpt.fastckpt-commit"]
