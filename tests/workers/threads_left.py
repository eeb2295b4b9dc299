"""Which threads are left running: the check that nothing fastckpt starts outlives the thing
that started it (a torn-down Trainer, a destroyed DeepSpeed engine, a closed Checkpointer).

    before = threads_now()
    ...                          # train, save, tear down
    assert threads_left(before) == []

threads_now() is the set of live Python threads. threads_left(before) names every Python
thread alive now that was not before (fastckpt's or not: Lightning's own suite fails a test
on any), and every native thread named fastckpt-* (the engine's writers and copiers name
themselves fastckpt-write and fastckpt-copy; /proc/self/task/*/comm).
"""
from __future__ import annotations

import os
import threading


def threads_now() -> set:
    return set(threading.enumerate())


def _native_fastckpt() -> list[str]:
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue  # ended while we looked
        if comm.startswith("fastckpt"):
            names.append(f"native {comm}")
    return names


def threads_left(before: set) -> list[str]:
    """What is alive now and was not in `before`. No grace: Lightning's suite checks at once too,
    so a thread that is merely ending must have been joined by whatever ended it."""
    return sorted([t.name for t in threading.enumerate() if t not in before and t.is_alive()] +
                  _native_fastckpt())
