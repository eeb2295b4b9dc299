"""kill -9 over a memory tier in front of the disk with a replica of each rank's part in its
partner's memory tier, on 2 gloo ranks named as on 2 nodes (tests/workers/tiers_worker.py).

Each round starts both ranks, which resume from the newest step every rank can get and then save
a step at a time; both are killed (SIGKILL) at a random moment. Before the next round, one of:
  kill      nothing else: the memory tier survived the process; the resume must read no disk
            byte (each rank its own memory-tier part, or its partner's replica when it was killed
            before its own record) — every disk copy is damaged (a byte flipped) while it resumes,
            and put back after, so a resume that read one would fall back or load other values;
  wipe_one  rank 1's memory-tier folder is removed (its node lost): rank 1 gets its part from the
            replica rank 0 keeps, when rank 0 still keeps it for the step both can get (else the
            disk), rank 0 from its memory tier (else the disk);
  wipe_all  the whole memory tier is removed: both read the disk.
Every round: the resume is bit-exact on both ranks, both resume the same step, never one older
than the newest every rank still holds (checked here from the records themselves), and never
older than the last step reported committed when the memory tier survived. 21 rounds; 201 with
--many. Run again with persist_every=2 (every other save persisted to the disk, the others in
memory alone: a wiped memory tier falls back further, to what the disk holds).
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from fastckpt.commit import record
from fastckpt.errors import CorruptCheckpointError
from support import warm
from support.paths import ROOT, WORKERS, python_path
from support.processes import free_port

pytestmark = pytest.mark.slow
MODES = ("kill", "wipe_one", "wipe_all")


def steps_in(folder: str, rank: int) -> set[int]:
    """Steps whose record reads and whose rank file is there with its size, directly under folder."""
    found = set()
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        path = os.path.join(folder, name)
        try:
            info = record.read(path, None, None)
            entry = info.entry_for(rank)
            if os.path.getsize(os.path.join(path, entry.name)) == entry.bytes:
                found.add(info.step)
        except (CorruptCheckpointError, OSError):
            continue
    return found


def newest_everyone_holds(memory: str, disk: str) -> int:
    held = [steps_in(os.path.join(memory, f"rank-{r}"), r) | steps_in(disk, r)
            | steps_in(os.path.join(memory, f"rank-{1 - r}"), r) for r in (0, 1)]
    common = held[0] & held[1]
    return max(common, default=0)


def flip_disk_copies(disk: str) -> list[str]:
    """One byte flipped in every file of every committed checkpoint on the disk tier; the files."""
    flipped = []
    for name in os.listdir(disk) if os.path.isdir(disk) else []:
        folder = os.path.join(disk, name)
        try:
            info = record.read(folder, None, None)
        except (CorruptCheckpointError, OSError):
            continue
        for entry in info.files:
            path = os.path.join(folder, entry.name)
            _flip(path)
            flipped.append(path)
    return flipped


def put_back(flipped: list[str]) -> None:
    """The flipped bytes flipped back (a file retention removed meanwhile is gone)."""
    for path in flipped:
        try:
            _flip(path)
        except FileNotFoundError:
            continue


def _flip(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))


def round_of(memory: str, disk: str, rng: random.Random, on_ready, idle: int,
             persist_every: int = 1) -> tuple[list[str], int]:
    """Both ranks, killed at a random moment after both said ready (idle: once they made that
    many saves durable on both tiers and stopped); (each rank's resume line, the last step rank 0
    reported committed)."""
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PYTHONPATH=python_path(ROOT, WORKERS), FASTCKPT_NODE=f"node-{rank}")
        procs.append(warm.popen([sys.executable, os.path.join(WORKERS, "tiers_worker.py"), memory, disk,
                                 str(idle), str(persist_every)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True))
    resumed, ready, committed, lines = [None, None], [threading.Event(), threading.Event()], [0], [[], []]
    idled = [threading.Event(), threading.Event()]

    def read(rank):
        for line in procs[rank].stdout:
            lines[rank].append(line)
            if line.startswith("resumed"):
                resumed[rank] = line.split()
            elif line.startswith("ready"):
                ready[rank].set()
            elif line.startswith("idle"):
                idled[rank].set()
            elif line.startswith("committed") and rank == 0:
                committed[0] = int(line.split()[1])
    readers = [threading.Thread(target=read, args=(r,), daemon=True) for r in (0, 1)]
    for t in readers:
        t.start()
    try:
        for r in (0, 1):
            assert ready[r].wait(90), f"rank {r} never got ready:\n{''.join(lines[r])[-3000:]}"
        on_ready()
        if idle:
            for r in (0, 1):
                assert idled[r].wait(90), f"rank {r} never got idle:\n{''.join(lines[r])[-3000:]}"
        else:
            time.sleep(rng.uniform(0.3, 1.5))
    finally:
        died = [r for r in (0, 1) if procs[r].poll() is not None]  # ended before the kill: a failure
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:  # its peer was killed first: it ended on the broken collective
                pass
        for p in procs:
            p.wait(60)
        for t in readers:
            t.join(30)
    assert not died, (f"rank(s) {died} ended by themselves ({[p.returncode for p in procs]}):\n"
                      + "\n".join("".join(lines[r])[-3000:] for r in died))
    return resumed, committed[0], lines


@pytest.mark.parametrize("persist_every", [1, 2])
def test_kill9_campaign_over_a_memory_tier_and_the_disk(tmp_path, shm, many, persist_every):
    rounds = (201 if persist_every == 1 else 101) if many else 21
    rng = random.Random(45)
    memory, disk = os.path.join(shm, "memory-tier"), str(tmp_path / "disk")
    mode, expect, told, flipped = "kill", 0, 0, []
    seen = {m: 0 for m in MODES + ("kill, on disk too", "wipe_one, from the replica")}
    for i in range(rounds):
        flipped = flip_disk_copies(disk) if mode == "kill" else []
        in_memory = [steps_in(os.path.join(memory, f"rank-{r}"), r) for r in (0, 1)]
        in_partner = [steps_in(os.path.join(memory, f"rank-{1 - r}"), r) for r in (0, 1)]  # replicas kept
        on_disk = [steps_in(disk, r) for r in (0, 1)]
        # every third round stops once its saves are durable on both tiers (the last of them one
        # the cadence persists), so that the next resume (after a plain kill) finds its step on the
        # disk too: reading it there would show
        idle = 3 * persist_every if i % 3 == 0 and i > 0 else 0
        resumed, last, lines = round_of(memory, disk, rng, lambda: put_back(flipped), idle, persist_every)
        where = f"round {i} (after {mode}): " + " | ".join("".join(x)[-1500:] for x in lines)
        steps = [int(r[1]) for r in resumed]
        assert steps[0] == steps[1], f"{where}: the ranks resumed different steps {steps}"
        assert all(r[3] == "1" for r in resumed), f"{where}: a resume is not bit-exact"
        assert steps[0] >= expect, f"{where}: resumed step {steps[0]}, but every rank held step {expect}"
        if mode == "kill":
            assert steps[0] >= told, f"{where}: resumed {steps[0]}, but step {told} was reported committed"
        if steps[0]:
            tiers = [set(r[2].split(",")) for r in resumed]
            # a rank reads the step from its memory tier whenever that still holds it; after a process
            # kill it always does (the memory tier keeps the newest steps, which are the newest held)
            want = [{memory} if steps[0] in in_memory[r] else {f"replica_of_rank_{1 - r}"}
                    if steps[0] in in_partner[r] else {disk} for r in (0, 1)]
            # after a process kill no rank reads the disk: its own part, or the replica its partner
            # keeps (a rank killed between its partner's record and its own has only that)
            assert mode != "kill" or disk not in set().union(*want), f"{where}: step {steps[0]} not in memory"
            if mode == "kill" and all(steps[0] in on_disk[r] for r in (0, 1)):
                seen["kill, on disk too"] += 1
            if mode == "wipe_one" and want[1] == {"replica_of_rank_0"}:
                seen["wipe_one, from the replica"] += 1
            assert mode != "wipe_all" or want == [{disk}, {disk}]
            assert tiers == want, f"{where}: read from {tiers}, expected {want}"
            assert all(r[4] == "0" for r in resumed), f"{where}: the resume warned"
            seen[mode] += 1
        told = last
        mode = MODES[i % 3] if i >= 2 else "kill"
        if mode == "wipe_one":
            shutil.rmtree(os.path.join(memory, "rank-1"), ignore_errors=True)
        elif mode == "wipe_all":
            shutil.rmtree(memory, ignore_errors=True)
        expect = newest_everyone_holds(memory, disk)
    print(f"\n{rounds} rounds: {seen}")
    assert all(n >= 3 for n in seen.values()), seen


def _copy_of(memory: str, keeper: int, part: int, step: int) -> str:
    """The file of rank part's part of step in rank keeper's memory-tier folder."""
    folder = os.path.join(memory, f"rank-{keeper}")
    name = next(n for n in os.listdir(folder) if n.startswith(f"step-{step:08d}."))
    return os.path.join(folder, name, f"rank-{part}.pt")


@pytest.mark.parametrize("bad", ["own copy", "replica", "own copy and replica"])
def test_a_bad_memory_copy_or_replica_is_named_and_skipped_to_the_next_tier(tmp_path, shm, bad):
    memory, disk = os.path.join(shm, "memory-tier"), str(tmp_path / "disk")
    rng = random.Random(0)
    _, _, first = round_of(memory, disk, rng, lambda: None, idle=3)  # steps 1-3 durable on both tiers, then killed
    # each rank received its partner's part straight into the mapping of the replica's file
    assert all("idle 1\n" in first[r] for r in (0, 1)), first
    own, replica = _copy_of(memory, 1, 1, 3), _copy_of(memory, 0, 1, 3)
    if bad in ("own copy", "own copy and replica"):
        _flip(own)
    else:
        shutil.rmtree(os.path.join(memory, "rank-1"))  # rank 1's node lost: only the replica is left
    if "replica" in bad:
        _flip(replica)
    resumed, _, lines = round_of(memory, disk, rng, lambda: None, idle=0)
    out = "".join(lines[1])
    assert [r[1] for r in resumed] == ["3", "3"] and all(r[3] == "1" for r in resumed), out
    want = {"own copy": "replica_of_rank_0", "replica": disk, "own copy and replica": disk}[bad]
    assert resumed[1][2] == want and resumed[0][2] == memory, (resumed, out)
    warned = [x for x in lines[1] if x.startswith("warned")]
    assert len(warned) == bad.count("copy") + bad.count("replica"), out
    if "own copy" in bad:
        assert any(memory in w and own in w and "does not verify" in w for w in warned), warned
    if "replica" in bad:
        assert any("the replica kept by rank 0" in w and "does not verify" in w for w in warned), warned
    # no restart loop: the next resume takes the same step again, now without a warning
    again, _, lines = round_of(memory, disk, rng, lambda: None, idle=0)
    assert [r[1] for r in again] == ["3", "3"] or int(again[0][1]) > 3, again
    assert all(r[3] == "1" for r in again), "".join(lines[1])
