"""Kills under torchtitan_fastckpt: a torchtitan run (tests/workers/titan_worker.py, 2 gloo ranks,
FSDP2, async saves every step, keep_latest_k=3) is killed with SIGKILL — one rank or both, at a
random moment — and restarted, again and again, in the same folder. Each restart resumes from the
newest checkpoint, equal bit for bit to the state the killed run had at that step, and never from
step 0 once a step was committed; at the end no folder of a save cut short is older than the
newest committed checkpoint. (Saves commit in order, so a kill leaves cut-short folders only
above the newest; the removal of ones below it, should any appear, is tested on its own in
tests/fastckpt/dcp/test_resumable.py.) Rounds: TITAN_KILLS (default 4; the issue asks for 20).
"""
from __future__ import annotations

import os
import random
import threading
import time

import pytest
import torch

pytest.importorskip("torchtitan", reason="torchtitan is a test dependency (setup.cfg: dev)")

from fastckpt.dcp import newest_committed, resumable  # noqa: E402
from support.processes import kill_ranks  # noqa: E402
from support.states import equal  # noqa: E402
from test_torchtitan import launch  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled"), pytest.mark.timeout(1800)]
ROUNDS = int(os.environ.get("TITAN_KILLS", "4"))


def killed_round(ckpt, out, rng: random.Random) -> tuple[int, str]:
    """Starts a run to step 10000, kills it once it has saved a few more steps; (step it loaded, log)."""
    procs = launch("fast", "async", ckpt, out, 10000)
    lines: list[str] = []
    enough = threading.Event()
    wanted = rng.randint(2, 6)

    def read():
        saved = 0
        for line in procs[0].stdout:
            lines.append(line)
            if line.startswith("saved "):
                saved += 1
                if saved >= wanted:
                    enough.set()

    threading.Thread(target=read, daemon=True).start()
    assert enough.wait(300), "".join(lines)[-3000:]
    time.sleep(rng.uniform(0.0, 0.3))
    kill_ranks(procs, [procs[1]] if rng.random() < 0.5 else procs)
    log = "".join(lines)
    loaded = int(next(line for line in log.splitlines() if line.startswith("loaded ")).split()[1])
    return loaded, log


def test_runs_killed_again_and_again_resume_bit_exact_and_leave_no_cut_short_folder_behind(tmp_path):
    rng = random.Random(int(os.environ.get("TITAN_KILLS_SEED", "7")))
    ckpt, newest_before = tmp_path / "ckpt", None
    for n in range(ROUNDS):
        out = tmp_path / f"round{n}"
        loaded, log = killed_round(ckpt, out, rng)
        if newest_before is None:
            assert loaded == 0
        else:  # the newest checkpoint the last round left, and exactly the state that run had then
            assert loaded == newest_before.step, (loaded, newest_before)
            assert equal(torch.load(out / "loaded.pt", weights_only=True),
                         torch.load(_holder(tmp_path, n, loaded) / f"state-{loaded}.pt", weights_only=True))
        newest_before = newest_committed(ckpt, warn=False)
        assert newest_before is not None and newest_before.step >= max(loaded, 1), log[-3000:]
    usable, unusable = resumable(ckpt)
    assert len(usable) <= 3 + 2  # keep_latest_k=3, and what the last kill left before its purge
    older = [u.path for u in unusable if int(os.path.basename(u.path).split("-")[1]) < usable[0].step]
    assert not older, (older, usable[0])


def _holder(tmp_path, n: int, step: int):
    """The latest round before n that trained `step` (the newest may predate the last round, when
    that round was killed before it committed a step of its own)."""
    for m in range(n - 1, -1, -1):
        if (tmp_path / f"round{m}" / f"state-{step}.pt").exists():
            return tmp_path / f"round{m}"
    raise AssertionError(f"no round kept step {step}")
