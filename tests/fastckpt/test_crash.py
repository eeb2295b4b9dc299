"""kill -9 at random moments while a child checkpoints with concurrency >= 2.

After every kill: latest() exists, load() verifies every CRC, the state is
exactly the one saved at that step, and the step is >= the last one the child
saw committed. 30 kills by default; 1000 with --many.
"""
from __future__ import annotations

import random

import pytest

import fastckpt
from fastckpt.tools.cli import main as cli_main

from workers.crash_child import state_for  # noqa: E402
from support.states import assert_same  # noqa: E402
from support.processes import kill_at_random  # noqa: E402


def run_and_kill(root: str, rng: random.Random, concurrency: int, fmt: str) -> int:
    """Starts the child, kills it at a random moment after it starts saving; returns last committed."""
    committed = [0]

    def on_line(line: str) -> None:
        if line.startswith("committed"):
            committed[0] = max(committed[0], int(line.split()[1]))

    kill_at_random("crash_child.py", [root, str(concurrency), fmt], rng, 0.6, on_line)
    return committed[0]


@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
def test_kill9_campaign(tmp_path, many, fmt):
    kills = (1000 if many else 30) // (1 if fmt == "torch" else 3)
    rng = random.Random(42)
    root = str(tmp_path / "ck")
    for i in range(kills):
        concurrency = 2 + i % 3
        last = run_and_kill(root, rng, concurrency, fmt)
        ck = fastckpt.Checkpointer(root)
        info = ck.latest()
        if last == 0 and info is None:
            continue  # killed before the first commit: nothing to recover yet
        assert info is not None, f"kill {i}: no checkpoint although step {last} was committed"
        assert info.step >= last, f"kill {i}: latest step {info.step} < committed {last}"
        out = ck.load()  # verifies every CRC
        assert_same(state_for(info.step), out)
        assert cli_main(["verify", info.path]) == 0
