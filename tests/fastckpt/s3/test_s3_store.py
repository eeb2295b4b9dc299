"""The S3 store (fastckpt/store/s3/) on 2 real gloo ranks against a real S3 server (SeaweedFS on
loopback): save -> load bit-exact through the Checkpointer; the server stopped mid-save and
restarted; what a killed writer leaves; a flipped byte in a stored object."""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import uuid

import pytest
import torch

import fastckpt
from support import warm
from support.paths import ROOT, WORKERS, python_path
from support.processes import free_port, outputs_of
from workers.s3_worker import state_for  # noqa: E402


def launch(mode: str, url: str, flags: str = "", env_of: dict | None = None) -> list[subprocess.Popen]:
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PYTHONPATH=python_path(ROOT, WORKERS), **(env_of or {}).get(rank, {}))
        procs.append(warm.popen([sys.executable, os.path.join(WORKERS, "s3_worker.py"), mode, url, flags],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
    return procs


def fresh_url(server) -> str:
    return f"s3://{server.bucket}/run-{uuid.uuid4().hex[:8]}"


def test_two_ranks_save_to_s3_and_load_bit_exact(s3_env):
    url = fresh_url(s3_env)
    procs = launch("roundtrip", url)
    outs = outputs_of(procs, 300, "roundtrip")
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, out
        assert f"rank {rank} OK 3 2" in out, out  # keep=2: two committed left
    ck = fastckpt.Checkpointer(url)
    try:
        info = ck.latest()
        assert info.step == 3 and sorted(f.rank for f in info.files) == [0, 1]
        assert all(f.etag for f in info.files)  # the record names each object's ETag
        keys = [o.key for o in ck.store.bucket.listing(ck.store.where.key(""))]
        named = sorted(re.sub(r"\.[0-9a-f]{8}\.pt$", ".pt", k.split("/", 1)[1]) for k in keys)  # writer's token
        assert named == sorted(["latest"] + [f"step-0000000{s}.c00000{s}/{n}" for s in (2, 3)
                                             for n in ("COMMIT", "rank-0.pt", "rank-1.pt")]), named
        for rank in (0, 1):
            assert torch.equal(ck.load(rank=rank)["w"], state_for(rank, 3)["w"])
        assert ck.store.bucket.uploads(ck.store.where.key("")) == []  # no unfinished upload billed
    finally:
        ck.close()


def run_outage(url: str, flags: str, down, up, env_of: dict | None = None) -> list[str]:
    """2 ranks of the worker's outage mode: step 1 committed on both; down(); step 2 must fail on
    both within the bounded retries, step 1 staying the latest; up(); step 3 must commit on both.
    Returns each rank's whole output."""
    os.makedirs(flags)
    procs = launch("outage", url, flags, env_of)
    lines: list[list[str]] = [[], []]

    def line_of(rank: int, prefix: str) -> str:
        for line in procs[rank].stdout:
            lines[rank].append(line)
            if line.startswith(prefix):
                return line
        raise AssertionError(f"rank {rank} ended before {prefix!r}:\n{''.join(lines[rank])}")

    try:
        for rank in (0, 1):
            assert "committed" in line_of(rank, f"rank {rank} step 1"), lines[rank]
        down()
        open(os.path.join(flags, "down"), "w").close()
        for rank in (0, 1):
            said = line_of(rank, f"rank {rank} step 2")
            assert "failed" in said, said
            assert float(said.split(" in ")[1].split()[0]) < 60, said  # bounded: no barrier hang
        up()
        open(os.path.join(flags, "up"), "w").close()
        outs = outputs_of(procs, 180, "outage")
    finally:
        for p in procs:
            p.kill()
    for rank in (0, 1):
        out = "".join(lines[rank]) + outs[rank]
        assert procs[rank].returncode == 0, out
        assert f"rank {rank} step 3 committed" in out and "latest on each rank [3, 3]" in out, out
    ck = fastckpt.Checkpointer(url)
    try:
        assert [i.step for i in ck.store.committed()] == [3, 1]
        assert ck.store.bucket.uploads(ck.store.where.key("")) == []  # step 2's aborted or swept
    finally:
        ck.close()
    return ["".join(lines[rank]) + outs[rank] for rank in (0, 1)]


def test_the_server_stopped_mid_save_fails_that_save_on_every_rank_and_the_next_one_commits(tmp_path, monkeypatch):
    """A server of its own, stopped while step 2 is saved and restarted on the same ports."""
    from support.s3_server import S3Server
    server = S3Server(str(tmp_path / "server")).start()
    try:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        run_outage(fresh_url(server), str(tmp_path / "flags"), server.stop, server.restart)
    finally:
        server.stop()


def test_a_slowdown_storm_on_one_rank_fails_every_rank_together_with_no_barrier_hang(s3_env, tmp_path):
    """Rank 1 alone talks to the server through a proxy that answers its writes with 503 SlowDown
    while step 2 is saved (tests/support/s3_faults.py; the real server behind it): rank 1 retries a
    bounded number of times and fails, and rank 0, whose own upload succeeded, fails step 2 too in
    the same bounded time instead of waiting in a barrier; step 1 stays the latest on both, and
    once the storm is over step 3 commits on both."""
    from support.s3_faults import S3Faults
    faults = S3Faults(s3_env.endpoint).start()
    try:
        def storm():
            faults.storm = True

        def calm():
            faults.storm = False
        outs = run_outage(fresh_url(s3_env), str(tmp_path / "flags"), storm, calm,
                          env_of={1: {"AWS_ENDPOINT_URL": faults.endpoint}})
        assert faults.refused > 1  # retried, then gave up
        assert "503" in outs[1] or "SlowDown" in outs[1] or "Slow Down" in outs[1], outs[1]
    finally:
        faults.stop()


@pytest.mark.parametrize("over", ["bucket", "tiers"])
def test_kill9_campaign_during_uploads_and_commits_loses_nothing_and_leaves_no_upload_behind(s3_env, many, over,
                                                                                            tmp_path):
    """Both ranks killed with SIGKILL at a random moment of their saves (mid-upload, mid-record,
    between the record and `latest`); the next job, started on the same prefix, must find the
    newest step any rank saw committed (0 lost), load it bit for bit on every rank (0 torn accepted),
    pass over nothing damaged, and once it committed, leave no unfinished upload older than its
    newest checkpoint. Straight to the bucket, and over a memory tier drained to it (tiers, with
    replicas: a step is committed once in memory; the kills land in its drain too). 20 rounds; 200
    with --many."""
    import random
    import signal
    import threading
    import time
    url, rng = fresh_url(s3_env), random.Random(66)
    seen = 0
    tally = {"rounds": 0, "lost": 0, "torn": 0, "passed over": 0, "orphans": 0, "killed mid-upload": 0,
             "killed before the record": 0}
    for round_ in range(200 if many else 20):
        procs = launch("campaign", url, str(tmp_path / "memory") if over == "tiers" else "",
                       {r: {"FASTCKPT_NODE": f"node-{r}"} for r in (0, 1)})
        said: list[list[str]] = [[], []]
        ready = [threading.Event(), threading.Event()]

        def read(i):
            for line in procs[i].stdout:
                said[i].append(line)
                if line.startswith("ready"):
                    ready[i].set()

        threads = [threading.Thread(target=read, args=(i,), daemon=True) for i in (0, 1)]
        for t in threads:
            t.start()
        if not all(r.wait(120) for r in ready):
            for p in procs:
                p.kill()
            raise AssertionError("a rank never got ready:\n" + "\n---\n".join("".join(s) for s in said))
        time.sleep(rng.uniform(0.0, 2.0))
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait()
        for t in threads:
            t.join(10)
        for rank in (0, 1):
            resumed = next(line for line in said[rank] if line.startswith("resumed")).split()
            step, exact, passed = int(resumed[1]), int(resumed[2]), int(resumed[3])
            tally["lost"] += step < seen
            tally["torn"] += not exact
            tally["passed over"] += passed
            tally["orphans"] += int(next(line for line in said[rank] if line.startswith("orphans")).split()[1])
        # what a rank was told: straight to the bucket, any rank's (one record commits every part); over
        # tiers, rank 0's (each rank's memory-tier record is its own; a part whose record a kill cut off
        # comes from the replica its partner kept, written before rank 0's record)
        told = said if over == "bucket" else said[:1]
        committed = [int(line.split()[1]) for s in told for line in s if line.startswith("committed")]
        seen = max([seen, *committed, step + 1])  # the resumed job's first save committed too
        tally["rounds"] += 1
        ck = fastckpt.Checkpointer(url)
        try:
            tally["killed mid-upload"] += bool(ck.store.bucket.uploads(ck.store.where.key("")))
            tally["killed before the record"] += any(row.status == "incomplete" for row in ck.store.listing())
        finally:
            ck.close()
    print(tally)
    assert tally["lost"] == tally["torn"] == tally["passed over"] == tally["orphans"] == 0, tally
    # straight to the bucket, both windows are hit; over tiers the drain's window between the last object
    # and the record is short (0 of 20 rounds hit it once in CI): there, the kills must land mid-upload
    landed = tally["killed mid-upload"] and (tally["killed before the record"] or over == "tiers")
    assert landed, f"the kills missed the uploads: {tally}"


def _flip_stored_byte(server, data: bytes) -> None:
    """One byte of a stored object flipped where the server keeps it (its volume files on disk):
    found by a run of the object's own bytes, in every copy the server holds (another test of the
    session may have stored the same state)."""
    import glob
    marker, flipped = data[len(data) // 2:len(data) // 2 + 64], 0
    for path in glob.glob(os.path.join(server.folder, "data", "**", "*.dat"), recursive=True):
        with open(path, "r+b") as f:
            raw = f.read()
            at = raw.find(marker)
            while at >= 0:
                f.seek(at)
                f.write(bytes([raw[at] ^ 0xFF]))
                flipped += 1
                at = raw.find(marker, at + 1)
    assert flipped, "the object's bytes are in no volume file of the server"


def test_a_flipped_byte_in_a_stored_object_is_named_and_passed_over_for_the_previous_checkpoint(s3_env):
    url = fresh_url(s3_env)
    ck = fastckpt.Checkpointer(url, keep=0, stall_timeout_s=8)
    try:
        for step in (1, 2):
            ck.save(state_for(0, step, 6), step=step).wait()
    finally:
        ck.close()
    _flip_stored_byte(s3_env, state_for(0, 2, 6)["w"].numpy().tobytes())
    reader = fastckpt.Checkpointer(url, stall_timeout_s=8)
    try:
        with pytest.warns(UserWarning, match=r"passed over: checkpoint step 2 in s3://.*step-00000002"):
            out = reader.load()
        assert out["step"] == 1 and torch.equal(out["w"], state_for(0, 1, 6)["w"])
        with pytest.raises(OSError, match=r"s3://.*/step-00000002\.c000002/rank-0\.[0-9a-f]{8}\.pt"):
            reader.store.verify(reader.store.committed()[0])
    finally:
        reader.close()


def test_an_object_written_over_after_its_commit_is_passed_over_and_named(s3_env):
    """Same size, other bytes (another writer's PUT over a committed part): its ETag is not the one
    the record names, so the checkpoint is no longer listed as committed, and why is said."""
    url = fresh_url(s3_env)
    ck = fastckpt.Checkpointer(url, keep=0)
    try:
        for step in (1, 2):
            ck.save(state_for(0, step, 1), step=step).wait()
        newest = ck.store.committed()[0]
        key = ck.store.where.key_of(newest.file_for(0))
        size = ck.store.bucket.size_of(key)
        ck.store.bucket.put_bytes(key, b"\0" * size)
        problems: list = []
        assert [i.step for i in ck.store.committed(problems)] == [1]
        assert len(problems) == 1 and "step-00000002" in problems[0] and "written over" in problems[0], problems
    finally:
        ck.close()


def test_a_record_is_written_once_and_the_loser_deletes_nothing_of_the_winner(s3_env):
    """Two jobs on one prefix that took the same counter (the second listed the prefix before the
    first committed): the second's record PUT is refused by the server (If-None-Match: *), its
    save fails, and its cleanup leaves the first's checkpoint, record and objects, as they were."""
    url = fresh_url(s3_env)
    first, second = fastckpt.Checkpointer(url), fastckpt.Checkpointer(url, stall_timeout_s=8)
    try:
        saved = first.save(state_for(0, 1, 1), step=1).wait()
        second.store.next_counter = lambda: 1  # what it listed before the first committed
        with pytest.raises(fastckpt.CheckpointWriteError, match="exists already"):
            second.save(state_for(0, 1, 1), step=1).wait()
        problems: list = []
        assert [(i.step, i.counter) for i in first.store.committed(problems)] == [(1, saved.counter)], problems
        assert torch.equal(first.load()["w"], state_for(0, 1, 1)["w"])
    finally:
        second.close()
        first.close()


def test_retention_aborts_unfinished_uploads_older_than_the_newest_and_never_a_newer_one(s3_env):
    """A killed writer's upload of an old checkpoint is aborted by the next commit's retention; an
    upload of a checkpoint above the newest (one another rank may still be writing) is left."""
    url = fresh_url(s3_env)
    ck = fastckpt.Checkpointer(url, keep=2)
    try:
        ck.save(state_for(0, 1, 1), step=1).wait()
        prefix, control = ck.store.where.key(""), ck.store.bucket.control
        for counter in (1, 9):
            control.create_multipart_upload(Bucket=s3_env.bucket, Key=f"{prefix}step-0000000{counter}.c00000{counter}/rank-1.pt")
        ck.save(state_for(0, 2, 1), step=2).wait()
        ck.save(state_for(0, 3, 1), step=3).wait()  # retention runs after each commit
    finally:
        ck.close()  # every commit's retention has run (it follows the commit: wait() returns before it)
    left = [u.key[len(prefix):] for u in ck.store.bucket.uploads(prefix)]
    assert left == ["step-00000009.c000009/rank-1.pt"], left


def test_the_spool_keeps_at_most_its_spares_and_every_recycled_part_loads_exact(s3_env, shm):
    """An uploaded part's spool file is kept aside and written over by a later part (its memory
    recycled), never more than SPARES of them; parts of other sizes written over one load bit-exact."""
    from fastckpt.store.s3.spool import SPARE, SPARES, Spool
    spool = Spool()
    folder = spool.open()
    assert spool.memory, folder  # /dev/shm here (the shm fixture says it is there)
    try:
        made = []
        for i in range(SPARES + 2):  # more uploaded parts than it keeps
            made.append(spool.path(f"part-{i}"))
            with open(made[-1], "wb") as f:
                f.write(b"x" * (1 << 20))
            spool.keep(made[-1])
        assert not any(os.path.exists(p) for p in made)
        assert len(os.listdir(os.path.join(folder, SPARE))) == SPARES
        spool.reuse_into(spool.path("next"))
        assert os.path.getsize(spool.path("next")) == 1 << 20 and len(os.listdir(os.path.join(folder, SPARE))) == SPARES - 1
    finally:
        spool.close()
    url = fresh_url(s3_env)
    with fastckpt.Checkpointer(url, keep=5, chunk_mb=5) as ck:
        for step, mib in enumerate((12, 6, 12, 9, 12), start=1):
            ck.save(state_for(0, step, mib), step=step).wait()
            left = sorted(os.listdir(ck.store.spool.folder))
            assert left == ([SPARE] if ck.store.spool.memory else []), left  # no part of a landed save left
        for step, mib in enumerate((12, 6, 12, 9, 12), start=1):
            assert torch.equal(ck.load(step=step)["w"], state_for(0, step, mib)["w"])
