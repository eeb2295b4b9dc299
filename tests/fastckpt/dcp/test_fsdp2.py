"""The FSDP2 lines of docs/dcp.md, run: a model under fully_shard on 2 gloo ranks (CPU) saves every step
with dcp.async_save through FastStorageWriter and FastStager (2 saves in flight, none waited
for but the last, staged alone): every step's checkpoint equals, bit for bit, the run's state at
that step, and the last save's snapshot was handed on live, its copy made after async_save returned. One rank is killed with SIGKILL mid-run; the
newest committed checkpoint (fastckpt.dcp.newest_committed) then loads on 1 and on 2 ranks equal,
bit for bit, to the state the run had at that step, and the next step trained from it equals the
uninterrupted run's next step. A directory whose save the kill cut short is never the one chosen,
and FastStorageReader refuses it."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from fastckpt.dcp import FastStorageReader, committed, newest_committed
from support import readme_blocks, warm
from support.paths import ROOT, WORKERS, python_path
from support.processes import free_port, kill_ranks

STEPS = 6
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def launch(args: list[str], world: int, **extra: str) -> list[subprocess.Popen]:
    port, procs = free_port(), []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), PYTHONPATH=python_path(ROOT, WORKERS), **extra)
        procs.append(warm.popen([sys.executable, os.path.join(WORKERS, "fsdp2_worker.py"), *map(str, args)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True))
    return procs


def finish(procs, timeout: float = 300) -> list[str]:
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]
    return outs


def equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    return a == b


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The uninterrupted run: its checkpoints (ckpt/step-N), its full state after every step
    (rank 0's ref/step-N.pt) and what each rank printed."""
    root = tmp_path_factory.mktemp("fsdp2-ref")
    os.makedirs(root / "ref")
    return root, finish(launch(["train", root / "ckpt", STEPS, root / "ref"], 2))


@pytest.fixture(scope="module")
def reference(uninterrupted) -> str:
    return str(uninterrupted[0] / "ref")


def test_every_step_saved_with_two_in_flight_equals_the_state_at_that_step(uninterrupted):
    root, said = uninterrupted
    for step in range(1, STEPS + 1):
        want = torch.load(root / "ref" / f"step-{step}.pt", weights_only=True)
        got = torch.utils._pytree.tree_map_only(torch.Tensor, torch.zeros_like, want)
        dcp.load(got, storage_reader=FastStorageReader(root / "ckpt" / f"step-{step}"))  # 2 ranks -> 1
        assert equal(got, want), step
    for out in said:  # each rank printed its stager's counts; the last save, alone, was handed on live
        stats = json.loads(out.split("stager ", 1)[1].splitlines()[0])
        assert stats["staged"] == STEPS and stats["failed"] == 0 and stats["handed_on"] > 0, stats


def killed_run(ckpt, seed: int) -> None:
    """2 ranks train and save every step (0.3 s apart: a step alone takes milliseconds); once step 1
    is committed, rank 1 is killed with SIGKILL after a random delay, then rank 0 (left waiting
    for its peer)."""
    procs = launch(["train", ckpt, STEPS], 2, STEP_PAUSE_S="0.3")
    ready = threading.Event()
    lines: list[str] = []

    def read():
        for line in procs[0].stdout:
            lines.append(line)
            if line.startswith("ready"):
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    assert ready.wait(240), "".join(lines)[-3000:]
    time.sleep(random.Random(seed).uniform(0.0, 0.6))  # within steps 2-3
    assert all(p.poll() is None for p in procs), "a rank ended before the kill: " + "".join(lines)[-3000:]
    kill_ranks(procs, [procs[1]])


@pytest.mark.parametrize("seed", [1, 2])
def test_a_rank_killed_mid_run_resumes_bit_exact_from_the_newest_committed_on_one_and_two_ranks(
        tmp_path, reference, seed):
    ckpt = tmp_path / "ckpt"
    killed_run(ckpt, seed)
    newest = newest_committed(ckpt)
    assert newest is not None  # step 1 was committed before the kill
    step = int(os.path.basename(newest).split("-")[1])
    assert [int(os.path.basename(i.path).split("-")[1]) for i in committed(ckpt)] == list(range(step, 0, -1))
    for name in sorted(os.listdir(ckpt)):  # what the kill cut short is refused, never half-loaded
        if int(name.split("-")[1]) > step:
            with pytest.raises(CheckpointException):
                dcp.load({"model": {}}, storage_reader=FastStorageReader(ckpt / name))
    for world in (1, 2):
        out = tmp_path / f"out{world}"
        os.makedirs(out)
        said = finish(launch(["resume", ckpt, out], world))
        assert all(f"resumed {step}" in s for s in said), said
        assert equal(torch.load(out / "loaded.pt", weights_only=True),
                     torch.load(os.path.join(reference, f"step-{step}.pt"), weights_only=True))
        if step < STEPS:
            assert equal(torch.load(out / "next.pt", weights_only=True),
                         torch.load(os.path.join(reference, f"step-{step + 1}.pt"), weights_only=True))


def test_the_docs_fsdp2_calls_are_the_ones_this_test_makes():
    """The FSDP2 block of docs/dcp.md runs as written (test_first_hour); each of its calls of DCP
    and fastckpt.dcp, with its keyword names, is one tests/workers/fsdp2_worker.py makes, so the
    docs show what the kill test runs."""
    missing = readme_blocks.calls_not_in(os.path.join(ROOT, "docs", "dcp.md"), "FSDP2", "",
                                         os.path.join(WORKERS, "fsdp2_worker.py"),
                                         ("FastStorageWriter", "FastStager", "FastStorageReader", "newest_committed",
                                          "save_group", "get_state_dict", "set_state_dict", "async_save", "load"))
    assert not missing, missing