"""DCP on S3 (fastckpt.dcp.on_s3) against a real S3 server (SeaweedFS on loopback): a checkpoint
saved with FastStorageWriter("s3://...") on 2 gloo ranks (DTensor shards) is committed by its record
object alone, found by newest_committed("s3://..."), and loads resharded on 1 rank bit-exact through
FastStorageReader("s3://..."); a prefix without a record is refused; saves into step-N folders leave
nothing behind but committed checkpoints."""
from __future__ import annotations

import uuid

import pytest

from fastckpt.dcp import FastStorageReader, newest_committed
from fastckpt.errors import CorruptCheckpointError
from fastckpt.store.s3.client import bucket_for
from fastckpt.store.s3.place import S3Place

from tests.fastckpt.dcp.test_dcp_storage import run_ranks

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def test_a_dcp_checkpoint_saved_on_2_ranks_to_s3_loads_resharded_on_1_rank_bit_exact(s3_env):
    parent = f"s3://{s3_env.bucket}/dcp-{uuid.uuid4().hex[:8]}"
    url = f"{parent}/step-7"
    outs = run_ranks("save", url, 2)
    assert all(f"rank {r} SAVED" in out for r, out in enumerate(outs)), outs
    keys = sorted(o.key.rsplit("/", 1)[1] for o in bucket_for(S3Place.parse(url)).listing(S3Place.parse(url).key("")))
    assert keys == [".metadata", "COMMIT", "__0_0.distcp", "__1_0.distcp"], keys
    found = newest_committed(parent)
    assert found == url and found.step == 7 and found.by == "fastckpt"
    for world in (0, 2):  # resharded on one process, and back on two ranks
        outs = run_ranks("load", url, world)
        assert all("EQUAL" in out for out in outs), outs


def test_an_s3_prefix_without_a_record_is_refused(s3_env):
    url = f"s3://{s3_env.bucket}/dcp-{uuid.uuid4().hex[:8]}/step-1"
    place = S3Place.parse(url)
    bucket_for(place).put_bytes(place.key("__0_0.distcp"), b"a rank's file of a save cut short")
    with pytest.raises(CorruptCheckpointError, match="no committed DCP checkpoint"):
        FastStorageReader(url).read_metadata()
    assert newest_committed(url.rsplit("/", 1)[0]) is None


def test_saves_into_step_folders_commit_in_order_and_leave_nothing_uncommitted(s3_env):
    """Beside the saves: a save cut short before them (a rank's file, and an unfinished upload of
    another) is removed once a newer checkpoint is committed; a folder of anything else, though its
    name ends with a lower step, is left alone. Each rank's writer lets go of each checkpoint's
    local spool folder (on /dev/shm) once its save is over: none is left after any save."""
    parent = f"s3://{s3_env.bucket}/dcp-{uuid.uuid4().hex[:8]}"
    place = S3Place.parse(parent)
    bucket = bucket_for(place)
    bucket.put_bytes(place.key("step-0", "__0_0.distcp"), b"a save cut short")
    bucket.control.create_multipart_upload(Bucket=s3_env.bucket, Key=place.key("step-0", "__1_0.distcp"))
    bucket.put_bytes(place.key("eval2", "notes.txt"), b"not a checkpoint")
    outs = run_ranks("fill", parent, 2)
    for rank, out in enumerate(outs):  # each save's spool folder let go of once it is committed
        assert all(f"rank {rank} saved {step} spooled 0" in out for step in (1, 2, 3, 4)), out
    assert newest_committed(parent).step == 4
    outs = run_ranks("load-step", parent, 0, 3)
    assert "EQUAL" in outs[0], outs
    assert bucket.uploads(place.key("")) == []
    names = {o.key.split("/")[1] for o in bucket.listing(place.key(""))}
    assert names == {f"step-{s}" for s in (1, 2, 3, 4)} | {"eval2"}, names


def test_a_checkpoint_we_wrote_to_s3_loads_with_s3torchconnectors_reader(s3_env):
    """AWS's DCP storage (s3torchconnector's S3StorageReader) reads what FastStorageWriter put in the
    bucket — saved on 2 ranks, loaded resharded in one process, bit-exact: the objects are DCP's own
    files. (Its reader takes no endpoint: its filesystem is built over a client that has this
    server's, path style.) It checks no commit record: a prefix cut short is ours to refuse."""
    import torch
    import torch.distributed.checkpoint as dcp
    from s3torchconnector import S3ClientConfig
    from s3torchconnector._s3client import S3Client
    from s3torchconnector.dcp import S3StorageReader
    from s3torchconnector.dcp.s3_file_system import S3FileSystem
    from workers.dcp_worker import _equal, full_state

    url = f"s3://{s3_env.bucket}/dcp-{uuid.uuid4().hex[:8]}/step-7"
    outs = run_ranks("save", url, 2)
    assert all(f"rank {r} SAVED" in out for r, out in enumerate(outs)), outs
    config = S3ClientConfig(force_path_style=True)
    reader = S3StorageReader("us-east-1", url, s3client_config=config)
    reader.fs = S3FileSystem("us-east-1", s3_client=S3Client("us-east-1", endpoint=s3_env.endpoint,
                                                            s3client_config=config))

    def blank(d):
        return {k: blank(v) if isinstance(v, dict) else torch.zeros_like(v) if isinstance(v, torch.Tensor)
                else type(v)() for k, v in d.items()}
    state = blank(full_state())
    dcp.load(state, storage_reader=reader)
    assert _equal(state, full_state()) == []
