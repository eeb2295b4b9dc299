"""Lightning test runs: tests/workers/lit_worker.py alone or as 2 DDP ranks started as torchrun
would start them (each its own process, its log in OUT/log-RANK.txt), and the losses it wrote."""
from __future__ import annotations

import os
import subprocess
import sys

from . import warm
from .paths import WORKERS
from .processes import free_port

WORKER = os.path.join(WORKERS, "lit_worker.py")


def launch(out, *args, ddp=False, **env_extra: str) -> list[subprocess.Popen]:
    os.makedirs(out, exist_ok=True)
    base = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **env_extra}
    if not ddp:
        return [warm.popen([sys.executable, WORKER, str(out), *args], env=base,
                           stdout=open(os.path.join(out, "log-0.txt"), "a"), stderr=subprocess.STDOUT,
                           preload=("lightning",))]
    port = free_port()
    procs = []
    for r in range(2):
        env = {**base, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
               "NODE_RANK": "0", "LOCAL_RANK": str(r), "RANK": str(r)}
        procs.append(warm.popen([sys.executable, WORKER, str(out), "--ddp", *args], env=env,
                                stdout=open(os.path.join(out, f"log-{r}.txt"), "a"),
                                stderr=subprocess.STDOUT, preload=("lightning",)))
    return procs


def run(out, *args, ddp=False, timeout=240) -> None:
    procs = launch(out, *args, ddp=ddp)
    for i, p in enumerate(procs):
        if p.wait(timeout) != 0:
            for q in procs:
                q.kill()
            log = open(os.path.join(out, f"log-{i}.txt")).read()[-3000:]
            raise AssertionError(f"worker {i} exited with {p.returncode}:\n{log}")


def losses(out) -> dict[int, str]:
    out_ = {}
    for line in open(os.path.join(out, "loss-rank0.txt")):
        step, val = line.split()
        out_[int(step)] = val  # a resumed run rewrites the steps after its checkpoint
    return out_
