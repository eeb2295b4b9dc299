"""Bad input and failing storage: clear errors, nothing previously committed lost.

Real failures, no mocks: a tmpfs mounted small enough to run out of space, a
read-only mount, a file size limit (RLIMIT_FSIZE) in a child process.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from support import warm

import fastckpt
from fastckpt.format import plan_file


def state(n: int, seed: int = 0) -> dict:
    return {"w": torch.randn(n, generator=torch.Generator().manual_seed(seed)), "seed": seed}


@pytest.mark.parametrize("kw,match", [({"strategy": "x"}, "unknown strategy 'x'"),
                                      ({"store": "gcs"}, "unknown store 'gcs'"),
                                      ({"store": "s3"}, "store='s3' needs root='s3://bucket/prefix'"),
                                      ({"format": "npz"}, "unknown format 'npz'"),
                                      ({"policy": "drop"}, "unknown policy"),
                                      ({"concurrency": 0}, "concurrency must be"),
                                      ({"staging_mb": 1, "chunk_mb": 64}, "staging_mb")])
def test_bad_settings(tmp_path, kw, match):
    with pytest.raises(fastckpt.ConfigError, match=match):
        fastckpt.Checkpointer(tmp_path, **kw)


def test_root_under_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    ck = fastckpt.Checkpointer(tmp_path / "f" / "sub")
    with pytest.raises(fastckpt.CheckpointWriteError, match="cannot create checkpoint root"):
        ck.save(state(10), step=1)


def test_save_to_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        fastckpt.save(state(10), tmp_path / "nope" / "x.pt")


def test_load_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        fastckpt.load(tmp_path / "missing.pt")


def test_disk_full_keeps_previous_checkpoint(mount_tmpfs):
    root = mount_tmpfs(2 << 20)
    with fastckpt.Checkpointer(root) as ck:
        ck.save(state(1000, 1), step=1).wait()
        with pytest.raises(fastckpt.CheckpointWriteError, match="No space left on device"):
            ck.save(state(1_000_000, 2), step=2).wait()  # 4 MB into 2 MB: fails before any data moves
        assert ck.latest().step == 1
        assert ck.load()["seed"] == 1
        ck.save(state(1000, 3), step=3).wait()  # space came back: training goes on
        assert ck.load()["seed"] == 3


def test_commit_record_enospc_surfaces_later(mount_tmpfs):
    """Data fits, the commit record does not: the error comes from the background commit."""
    s = state(200_000, 5)
    size = plan_file(s).file_size
    root = mount_tmpfs(-(-size // 4096) * 4096)
    ck = fastckpt.Checkpointer(root, keep=1)
    p = ck.save(s, step=5)
    with pytest.raises(fastckpt.CheckpointWriteError, match="No space left"):
        p.wait()
    assert ck.latest() is None
    ck.save(state(10, 6), step=6)  # the failed dir was removed: this one fits
    ck.wait()
    assert ck.load()["seed"] == 6
    ck.close()
    assert ck.latest().step == 6


def test_unobserved_background_error_raised_by_next_call(mount_tmpfs):
    s = state(200_000, 5)
    root = mount_tmpfs(-(-plan_file(s).file_size // 4096) * 4096)
    ck = fastckpt.Checkpointer(root)
    p = ck.save(s, step=1)  # nobody waits on p
    p.wait_done()
    with pytest.raises(fastckpt.CheckpointWriteError, match="commit record of step 1"):
        ck.save(state(10, 2), step=2)
    ck.close()


def test_read_only_filesystem(mount_tmpfs):
    root = mount_tmpfs(1 << 20)
    with fastckpt.Checkpointer(root) as ck:
        ck.save(state(100, 1), step=1).wait()
    subprocess.run(["mount", "-o", "remount,ro", root], check=True)
    ck = fastckpt.Checkpointer(root)
    with pytest.raises(fastckpt.CheckpointWriteError, match="Read-only|not writable"):
        ck.save(state(100, 2), step=2)
    assert ck.load()["seed"] == 1


CHILD = r"""
import resource, signal, sys, torch, fastckpt
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
root = sys.argv[1]
with fastckpt.Checkpointer(root) as ck:
    ck.save({"w": torch.zeros(1000), "seed": 1}, step=1).wait()
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    try:
        ck.save({"w": torch.zeros(1 << 20), "seed": 2}, step=2).wait()
    except fastckpt.CheckpointWriteError as e:
        print("ERROR", e)
    print("LATEST", ck.latest().step)
"""


def test_file_too_large_error(tmp_path):
    r = warm.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert "ERROR" in r.stdout and "File too large" in r.stdout, r.stdout + r.stderr
    assert "LATEST 1" in r.stdout
