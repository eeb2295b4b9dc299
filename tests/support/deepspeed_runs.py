"""DeepSpeed test runs: every rank of tests/workers/ds_worker.py (or another worker) as its own
process, started as torchrun would start it, and the check that a resumed run repeats a trained
one exactly."""
from __future__ import annotations

import os
import subprocess
import sys

import torch

from . import warm
from .paths import WORKERS, python_path
from .processes import free_port, outputs_of


def launch(mode: str, save_dir, out, *extra: str, ranks: int = 1, script: str = "ds_worker.py",
           **env_extra: str) -> list[subprocess.Popen]:
    """Every rank of one worker command, each its own process."""
    port = str(free_port())
    procs = []
    for rank in range(ranks):
        env = {**os.environ, "MASTER_PORT": port, "DS_ACCELERATOR": "cpu", "PYTHONPATH": python_path(WORKERS),
               "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(ranks), **env_extra}
        procs.append(warm.popen([sys.executable, os.path.join(WORKERS, script), mode, str(save_dir),
                                 str(out), *extra], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, preload=("deepspeed",)))
    return procs


def run(mode: str, save_dir, out, *extra: str, ranks: int = 1, script: str = "ds_worker.py", timeout: float = 600,
        **env_extra: str) -> dict:
    procs = launch(mode, save_dir, out, *extra, ranks=ranks, script=script, **env_extra)
    logs = outputs_of(procs, timeout, mode)
    for rank, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {rank} exited {p.returncode}:\n{log[-6000:]}"
    return torch.load(out, weights_only=False)


def assert_resumed_exactly(trained: dict, resumed: dict) -> None:
    assert resumed["engine"] == "FastckptEngine"
    assert resumed["client"] == {"data_pos": 3, "note": "three steps"}
    assert resumed["losses"] == trained["losses"]  # same next steps: model, optimizer and lr restored
    assert resumed["global_steps"] == trained["global_steps"]
    assert trained["params"].keys() == resumed["params"].keys()
    for name, value in trained["params"].items():
        assert torch.equal(value, resumed["params"][name]), name
