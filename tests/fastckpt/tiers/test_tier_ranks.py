"""The memory tier on 2 real gloo ranks (tests/workers/tier_ranks_worker.py): retention on every
rank, the memory bound counting the partner's replicas, and a replica damaged in transit refused
on arrival on both of its receive paths.

(Kills and wiped tiers: test_tiers_campaign.py; one process: test_tiers.py.)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support import warm
from support.paths import ROOT, WORKERS, python_path
from support.processes import free_port

pytestmark = pytest.mark.slow


def run_ranks(mode: str, memory: str, disk: str, nodes: bool = False, timeout: float = 240) -> list[dict]:
    """Both ranks of tier_ranks_worker.py MODE; each one's result. nodes: the two ranks named as on
    two nodes (FASTCKPT_NODE), else both on this one."""
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PYTHONPATH=python_path(ROOT, WORKERS))
        if nodes:
            env["FASTCKPT_NODE"] = f"node-{rank}"
        procs.append(warm.popen([sys.executable, os.path.join(WORKERS, "tier_ranks_worker.py"), mode, memory, disk],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True))
    results = []
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rank, (p, out) in enumerate(zip(procs, outs)):
        lines = [line for line in out.splitlines() if line.startswith("result ")]
        assert p.returncode == 0 and lines, f"rank {rank} exited {p.returncode}:\n{out[-4000:]}"
        results.append(json.loads(lines[-1][len("result "):]))
    return results


def test_every_rank_keeps_exactly_its_tier_keep_on_its_memory_tier(tmp_path, shm):
    """tier_keep=[2, 3] on 2 ranks, 7 saves each: once each save landed, each rank's own memory-tier
    folder holds exactly its 2 newest checkpoints — rank 1's as well as rank 0's (each rank prunes its own folder; the
    shared disk is rank 0's to prune) — and no other step folder; the disk holds its 3 newest
persisted. Once with a
    partner replica and every save persisted (pruned as each copy lands), once with persist_every=3
    (the saves kept in memory alone are pruned as each commits)."""
    results = run_ranks("retention", shm, str(tmp_path / "disk"))
    for rank, got in enumerate(results):
        for run in ("a", "b"):
            assert got[run]["held"] == [1, 2, 2, 2, 2, 2, 2], (rank, run, got[run])  # after each save landed
            assert got[run]["memory"] == [6, 7], (rank, run, got[run])
            assert len(got[run]["folders"]) == 2, (rank, run, got[run])
        assert got["a"]["disk"] == [5, 6, 7] and got["b"]["disk"] == [3, 6, 7], (rank, got)  # b: 3, 6, then 7 at close


def test_the_memory_bound_counts_the_partners_replicas_and_degrades_to_the_disk_before_it_fills(tmp_path,
                                                                                                 mount_tmpfs):
    """replicas=1 with both ranks on one node, tier_keep [1, 2], concurrency 1, parts of 4 MiB: the
    tier needs (1 + 1 + 1) checkpoints x 2 parts (its own and its ward's) x 2 ranks = 48 MiB. A
    tmpfs of 36 MiB holds them without the replicas (24 MiB), not with them: every rank's first
    save finds no room, so no checkpoint is ever committed on the memory tier; every rank writes
    to the disk from then on, said in one warning, and nothing fails (no ENOSPC, no replica
    dropped)."""
    memory = mount_tmpfs(36 << 20)
    results = run_ranks("bound", os.path.join(memory, "tier"), str(tmp_path / "disk"))
    for rank, got in enumerate(results):
        about = [w for w in got["warnings"] if "no room" in w]
        assert len(about) == 1 and memory in about[0], (rank, got["warnings"])
        assert got["first"] == 1 and got["in_memory"] == [] and got["failed"] == 0, (rank, got)
        assert not [w for w in got["warnings"] if "No space" in w or "replica" in w], (rank, got["warnings"])
        assert got["disk"] == [3, 4] and got["exact"], (rank, got)


@pytest.mark.parametrize("receive", ["mapped", "buffered"])
def test_a_replica_damaged_in_transit_is_refused_on_arrival_named_and_not_counted(tmp_path, shm, receive):
    """Each rank keeps its partner's part of every checkpoint (replicas=1, two nodes). One byte of
    rank 0's part of step 2 is flipped as it reaches rank 1 — received straight into the mapping
    of its file on a tmpfs tier ("mapped"), or into a buffer written to a tier on a disk
    ("buffered"). Rank 1 checks it on arrival: it is refused, named in a warning (rank 0's part,
    step 2, its path), removed, and not counted as kept; the commit of step 2 goes on. Rank 0's
    memory tier is then lost: its part of step 2 comes from the disk (never the bad replica), its
    part of step 1 from the replica rank 1 kept, both bit-exact."""
    memory = os.path.join(shm, "tier") if receive == "mapped" else str(tmp_path / "local")
    results = run_ranks("flip", memory, str(tmp_path / "disk"), nodes=True)
    one = results[1]
    refused = [w for w in one["warnings"] if "failed its check on arrival" in w]
    assert len(refused) == 1, one["warnings"]
    assert "rank 0's part of step 2" in refused[0] and os.path.join(memory, "rank-1") in refused[0], refused
    assert one["kept"] == {"1": [0], "3": [0]}, one["kept"]
    assert not one["replica_of_step_2_there"]
    assert one["committed"] == [1, 2, 3] and results[0]["committed"] == [1, 2, 3]
    assert results[0]["kept"] == {"1": [1], "2": [1], "3": [1]}  # rank 1's parts reached rank 0 intact
    zero = results[0]
    assert zero["load_2"]["from"] == [os.path.join(str(tmp_path), "disk")] and zero["load_2"]["exact"], zero
    assert zero["load_1"]["from"] == ["replica of rank 1"] and zero["load_1"]["exact"], zero
    assert results[1]["load_2"]["exact"] and results[1]["load_1"]["exact"]
