"""The engine's threads and their priorities (Linux, /proc/self/task): the writers, whose puts
wait on the device, run at the caller's priority, so a busy CPU never leaves the disk idle
between two writes; the CRC threads (and puts that are CPU copies) run 10 lower, off the gate;
the copy threads, which the gate waits on, at the caller's priority."""
from __future__ import annotations

import os
import sys

import pytest
import torch

import fastckpt

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities are Linux's")


def _nice_by_name() -> dict[str, set[int]]:
    """comm -> the nice values of this process's threads of that name."""
    found: dict[str, set[int]] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except (FileNotFoundError, ProcessLookupError):  # ended meanwhile (between the listing and the read)
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        nice = int(stat[stat.rindex(")") + 2:].split()[16])  # field 19 of proc(5), counted after the name
        found.setdefault(name, set()).add(nice)
    return found


def test_writers_run_at_the_callers_priority_and_crc_threads_lower(tmp_path):
    own = os.getpriority(os.PRIO_PROCESS, 0)
    ck = fastckpt.Checkpointer(str(tmp_path), strategy="c", concurrency=1)
    try:
        ck.save({"w": torch.randn(1 << 20)}, step=1).wait()
        nice = _nice_by_name()
    finally:
        ck.close()
    assert nice.get("fastckpt-write") == {own}
    assert nice.get("fastckpt-copy") == {own}
    assert nice.get("fastckpt-crc") == {min(19, own + 10)}
