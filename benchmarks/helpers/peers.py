"""The peers, each measured the way a user runs it: torch.save/load, DCP save/async_save,
a Lightning-style async save (clone the tensors, then torch.save + fsync in a thread), and Meta's
torch_checkpointing (its CheckpointManager, as its docs configure it on a CPU-only host)."""
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


def fsync_tree(path: str) -> None:
    """Every file under path, and every folder, fsync'ed (what a writer that never fsyncs leaves to do)."""
    for folder, _, files in os.walk(path):
        for name in files:
            fsync_path(os.path.join(folder, name))
        fsync_path(folder)
    fsync_path(os.path.dirname(os.path.abspath(path)))


class TorchCheckpointing:
    """torch_checkpointing's CheckpointManager with async saves, long-lived as in training (its
    background writer process started once), configured as its docs say for a CPU-only host
    (docs/troubleshooting.md: no pinned memory, no non-blocking copy). Its blocked time is save()
    plus its documented guard before the state may change (`with manager.lock():`, which waits for
    the staging copy); its write is timed as it is (it never fsyncs) and with an fsync of every
    file it wrote. `opened(probe)` tries its default storage first (O_DIRECT writes, falling back
    to buffered ones only where the open itself is refused) and, when a save fails with it, uses
    buffered writes; `note` says which ran and why."""

    def __init__(self, direct_io: bool = True):
        from torch_checkpointing import CheckpointManager
        from torch_checkpointing.config import AsyncCheckpointSaverConfig
        from torch_checkpointing.staging import CheckpointStagerConfig
        from torch_checkpointing.storage.filesystem import LocalFileSystemStorageConfig
        cuda = torch.cuda.is_available()
        self.manager = CheckpointManager(CheckpointManager.Config(
            save=AsyncCheckpointSaverConfig(
                staging_config=CheckpointStagerConfig(use_pinned_memory=cuda, use_non_blocking_copy=cuda)),
            storage_config=None if direct_io else LocalFileSystemStorageConfig(use_direct_io=False)))
        self.note = "its default storage (use_direct_io=True)"

    @classmethod
    def opened(cls, probe: str) -> "TorchCheckpointing":
        """The default configuration if a small save succeeds with it at probe, else use_direct_io=False."""
        tc = cls()
        try:
            tc.save({"probe": torch.randn(1000)}, probe)
            return tc
        except Exception as e:  # noqa: BLE001 - its writer process's error, whatever it is
            said = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        finally:
            shutil.rmtree(probe, ignore_errors=True)
        try:
            tc.close()
        except Exception:  # noqa: BLE001 - its writer process already failed
            pass
        tc = cls(direct_io=False)
        tc.note = (f"use_direct_io=False: a save with its default storage failed here ({said[:160]}; "
                   "torch's zip writer's unaligned writes through O_DIRECT)")
        return tc

    def save(self, state, path: str, clear: bool = True) -> tuple[float, float, float]:
        """(blocked, until written as it is, until durable with an fsync of its files) seconds.
        clear: path removed first (not on several ranks saving one checkpoint: each a fresh path)."""
        if clear:
            shutil.rmtree(path, ignore_errors=True)
        t0 = time.perf_counter()
        written = self.manager.save(path, {"model": state})
        with self.manager.lock():
            blocked = time.perf_counter() - t0
        written.result()
        as_is = time.perf_counter() - t0
        fsync_tree(path)
        return blocked, as_is, time.perf_counter() - t0

    def load(self, path: str, into: dict) -> float:
        """Seconds to load path into the given tensors (in place, as its docs load; nothing is checked)."""
        t0 = time.perf_counter()
        self.manager.load(path, into={"model": into})
        return time.perf_counter() - t0

    def close(self) -> None:
        self.manager.close()
