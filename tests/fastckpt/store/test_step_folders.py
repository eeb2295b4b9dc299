"""store.root_store.StepFolders: the rules of a root's layout, the same wherever it lies — a folder
(RootStore) or a bucket's prefix (S3Store, on a real S3 server: SeaweedFS on loopback). Retention
keeps the newest `keep` committed checkpoints and removes a dead partial folder older than the
newest, never a newer one (another rank may still be writing it); `latest` moves only forward;
the listing says each folder's state, newest first."""
from __future__ import annotations

import os
import uuid

import pytest
import torch

import fastckpt
from fastckpt.store.root_store import dir_name


def state(step: int) -> dict:
    return {"step": step, "w": torch.arange(1000, dtype=torch.float32) + step}


class Root:
    def __init__(self, tmp_path):
        self.url = str(tmp_path / "run")

    def leave_partial(self, name: str) -> None:
        os.makedirs(os.path.join(self.url, name))
        with open(os.path.join(self.url, name, "rank-0.pt"), "wb") as f:
            f.write(b"cut short")


class Prefix:
    def __init__(self, s3_env):
        self.url = f"s3://{s3_env.bucket}/steps-{uuid.uuid4().hex[:8]}"

    def leave_partial(self, name: str) -> None:
        ck = fastckpt.Checkpointer(self.url)
        try:
            ck.store.bucket.put_bytes(ck.store.where.key(name, "rank-0.pt"), b"cut short")
        finally:
            ck.close()


@pytest.fixture(params=["root", "s3"])
def place(request, tmp_path):
    return Root(tmp_path) if request.param == "root" else Prefix(request.getfixturevalue("s3_env"))


def test_retention_latest_and_the_listing_follow_one_rule_wherever_the_root_lies(place):
    ck = fastckpt.Checkpointer(place.url, keep=2)
    try:
        ck.save(state(1), step=1).wait()
        place.leave_partial(dir_name(0, 0))  # older than the newest commit: a dead writer's
        place.leave_partial(dir_name(9, 90))  # newer than any commit: maybe another rank's, in flight
        for step in (3, 4, 5):  # counters 2, 3, 4: retention after each commit
            ck.save(state(step), step=step).wait()
        ck.close()  # every commit's retention has run
        rows = [(r.name, r.status, r.latest) for r in ck.store.listing()]
        assert rows == [(dir_name(9, 90), "incomplete", False), (dir_name(5, 4), "committed", True),
                        (dir_name(4, 3), "committed", False)], rows
        ck.store.move_latest(ck.store.committed()[1])  # an older one: latest never moves back
        assert ck.store.read_latest()["counter"] == 4
    finally:
        ck.close()
