"""The programs the power-loss simulator records, one per kind of save, and the states they save.

    python tests/crashsim/saves.py root ROOT   # a Checkpointer, store="root": 4 saves, 2 in flight at once
    python tests/crashsim/saves.py path ROOT   # a Checkpointer, store="path": last.ckpt saved over 3 times
    python tests/crashsim/saves.py dcp ROOT    # torch.distributed.checkpoint.save through FastStorageWriter

Each marks what it was told (mark(): opening ROOT/.sim-mark-TEXT, which the recording shim logs
and nothing creates): "committed:K" once the save of step K (and every one before it) is
reported committed (wait() returned), so a check knows what the disk owes it. state_of(step) is
the state a save of that step holds, the same in the recorded process and in the check.
"""
from __future__ import annotations

import os
import sys

import torch


def mark(root: str, text: str) -> None:
    """Tells the recording something (the shim logs it; nothing is created)."""
    try:
        open(os.path.join(root, f".sim-mark-{text}"), "rb").close()
    except FileNotFoundError:
        pass


def state_of(step: int) -> dict:
    """About 2.2 MB: three 1 MiB staging chunks, so a file has several writes in flight."""
    g = torch.Generator().manual_seed(1000 + step)
    return {"model": {"w": torch.randn(512, 1024, generator=g), "b": torch.randn(1024, generator=g)},
            "opt": {"exp_avg": torch.randn(64, 1024, generator=g)}, "step": step}


def root_store(root: str) -> None:
    import fastckpt
    with fastckpt.Checkpointer(root, concurrency=2, keep=2, chunk_mb=1, writers=2) as ck:
        ck.save(state_of(1), step=1)
        ck.wait()
        mark(root, "committed:1")
        ck.save(state_of(2), step=2)
        ck.save(state_of(3), step=3)  # in flight beside step 2
        ck.wait()
        mark(root, "committed:3")
        ck.save(state_of(4), step=4)  # retention removes step 2 once it lands
        ck.wait()
        mark(root, "committed:4")


PATH_SAVES = (("last.ckpt", 1), ("epoch=0.ckpt", 2), ("last.ckpt", 3), ("last.ckpt", 4))


def path_store(root: str) -> None:
    """ModelCheckpoint's pattern: a named file saved over again (last.ckpt), another beside it."""
    import fastckpt
    with fastckpt.Checkpointer(root, store="path", concurrency=2, chunk_mb=1, writers=2) as ck:
        for i, (name, step) in enumerate(PATH_SAVES):
            ck.save(state_of(step), step=step, path=os.path.join(root, name))
            ck.wait()
            mark(root, f"committed:{i}")


def dcp(root: str) -> None:
    """Two checkpoints, each into a folder of its own, with DCP's own save (no process group)."""
    import torch.distributed.checkpoint as dcp_api

    from fastckpt.dcp import FastStorageWriter
    for step in (1, 2):
        dcp_api.save(state_of(step), storage_writer=FastStorageWriter(os.path.join(root, f"step-{step}"), step=step))
        mark(root, f"committed:{step}")


if __name__ == "__main__":
    kind, where = sys.argv[1], sys.argv[2]
    {"root": root_store, "path": path_store, "dcp": dcp}[kind](where)
