"""The bucket as the last tier (tiers=[local, "s3://..."]) on 2 real gloo ranks against a real S3
server: saves commit on each node's local tier and are drained to the bucket from that committed
copy; a node that lost its local tier resumes from its partner's replica, and with every node's
lost, from the bucket, bit-exact."""
from __future__ import annotations

import os
import re

import pytest
import torch

import fastckpt
from fastckpt.config import CheckpointerConfig
from fastckpt.errors import CheckpointWriteError, ConfigError
from support.processes import outputs_of
from workers.s3_worker import state_for  # noqa: E402
from tests.fastckpt.s3.test_s3_store import fresh_url, launch


def test_two_nodes_drain_to_the_bucket_and_resume_from_a_replica_then_from_the_bucket(s3_env, tmp_path):
    url = fresh_url(s3_env)
    procs = launch("tiers", url, str(tmp_path), env_of={r: {"FASTCKPT_NODE": f"node-{r}"} for r in (0, 1)})
    outs = outputs_of(procs, 300, "tiers")
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, out
        # the newest drained (one older may have given way to it: copies slower than saves are superseded)
        assert re.search(rf"rank {rank} in the bucket \[(1, |2, )?3\]", out), out
        node = str(tmp_path / f"node-{rank}")
        # node-1 wiped: rank 0 reads its own local tier, rank 1 the replica rank 0 kept of its part
        first = node if rank == 0 else "replica of rank 0"
        assert f"rank {rank} after node-1 wiped: step 3 exact True from {first}" in out, out
        assert f"rank {rank} after every node wiped: step 3 exact True from {url}" in out, out
    ck = fastckpt.Checkpointer(url)  # the bucket alone is a checkpoint root of its own
    try:
        info = ck.latest()
        assert info.step == 3 and all(f.etag for f in info.files)
        for rank in (0, 1):
            assert torch.equal(ck.load(rank=rank)["w"], state_for(rank, 3)["w"])
        assert ck.store.bucket.uploads(ck.store.where.key("")) == []
    finally:
        ck.close()


def test_a_damaged_local_copy_never_reaches_the_bucket(s3_env, tmp_path, monkeypatch):
    """The copy to the bucket is checked against the record first: a flipped byte in the local
    tier fails that copy (named) before any byte of it is sent, and the bucket keeps nothing of it."""
    import obstore
    sent = []
    put = obstore.put

    def counted(store, key, *args, **kwargs):
        sent.append(key)
        return put(store, key, *args, **kwargs)
    monkeypatch.setattr(obstore, "put", counted)
    url = fresh_url(s3_env)
    local = tmp_path / "mem"
    state = {"w": torch.arange(1 << 20, dtype=torch.float32)}
    ck = fastckpt.Checkpointer(tiers=[str(local), url], persist_every=2, chunk_mb=1)
    ck.save(state, step=1).wait()  # persist_every=2: step 1 stays local until close() persists it
    (part,) = [os.path.join(d, f) for d, _, fs in os.walk(local) for f in fs if f.endswith(".pt")]
    with open(part, "r+b") as f:
        f.seek(os.path.getsize(part) // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x40]))
    with pytest.raises(CheckpointWriteError,
                       match=re.escape(f"the copy of step 1 to {url} failed: {part}: ") + ".*CRC-32"):
        ck.close()
    assert not [k for k in sent if k.endswith(".pt")], sent  # not a byte of the part was sent
    bucket = fastckpt.Checkpointer(url)
    try:
        assert bucket.store.committed() == [] and bucket.store.bucket.uploads(bucket.store.where.key("")) == []
        assert [o.key for o in bucket.store.bucket.listing(bucket.store.where.key(""))] == []
    finally:
        bucket.close()


def test_an_s3_tier_is_the_last_one_only():
    """A bucket stands only last, and as the last tier it is the root (store 's3')."""
    with pytest.raises(ConfigError, match="an s3:// tier is the last one"):
        CheckpointerConfig(tiers=["s3://ckpt/a", "/tmp/x"])
    config = CheckpointerConfig(tiers=["/dev/shm/a", "s3://ckpt/a/"])
    assert config.store == "s3" and config.root == "s3://ckpt/a/"
