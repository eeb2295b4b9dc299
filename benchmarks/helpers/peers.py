"""The peers, each measured the way a user runs it: torch.save/load, DCP save/async_save,
a Lightning-style async save (clone the tensors, then torch.save + fsync in a thread)."""
from __future__ import annotations

import os
import shutil
import threading
import time

import torch


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def torch_save(state, path: str) -> float:
    t0 = time.perf_counter()
    torch.save(state, path)
    fsync_path(path)
    return time.perf_counter() - t0


def torch_load(path: str) -> float:
    t0 = time.perf_counter()
    torch.load(path, weights_only=True)
    return time.perf_counter() - t0


def dcp_save(state, path: str) -> float:
    import torch.distributed.checkpoint as dcp
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    dcp.save(state, checkpoint_id=path)  # FileSystemWriter fsyncs (sync_files=True)
    return time.perf_counter() - t0


def dcp_async_save(state, path: str) -> tuple[float, float]:
    """(blocking seconds, seconds until durable)."""
    import torch.distributed.checkpoint as dcp
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    fut = dcp.async_save(state, checkpoint_id=path)
    blocking = time.perf_counter() - t0
    fut.result()
    return blocking, time.perf_counter() - t0


def clone_thread_save(state, path: str) -> tuple[float, float]:
    """What Lightning's AsyncCheckpointIO needs to be correct: a copy, then a background save."""
    t0 = time.perf_counter()
    copy = {k: v.detach().clone() for k, v in state.items()}
    done = []
    th = threading.Thread(target=lambda: done.append(torch_save(copy, path)))
    th.start()
    blocking = time.perf_counter() - t0
    th.join()
    return blocking, time.perf_counter() - t0
