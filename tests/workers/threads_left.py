"""Which threads are left running: the check that nothing fastckpt starts outlives the thing
that started it (a torn-down Trainer, a destroyed DeepSpeed engine, a closed Checkpointer).

    before = threads_now()
    ...                          # train, save, tear down
    assert threads_left(before) == []

threads_now() is the live Python threads and fastckpt's native ones. threads_left(before) names
every Python thread alive now that was not before (fastckpt's or not: Lightning's own suite
fails a test on any), and every native thread named fastckpt-* that was not there before (the
engine's writers, copiers and CRC threads name themselves fastckpt-write, -copy and -crc;
/proc/self/task/*/comm): a test of a process that ran others before it sees only its own.
"""
from __future__ import annotations

import os
import threading


def threads_now() -> tuple:
    """The live Python threads, and the native threads fastckpt named (their ids)."""
    return set(threading.enumerate()), set(_native_fastckpt())


def _native_fastckpt() -> dict:
    """tid -> name of the native threads named fastckpt-* (/proc/self/task/*/comm)."""
    found = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue  # ended while we looked
        if comm.startswith("fastckpt"):
            found[tid] = comm
    return found


def threads_left(before: tuple) -> list[str]:
    """What is alive now and was not in `before`. No grace: Lightning's suite checks at once too,
    so a thread that is merely ending must have been joined by whatever ended it."""
    python, native = before
    return sorted([t.name for t in threading.enumerate() if t not in python and t.is_alive()] +
                  [f"native {name}" for tid, name in _native_fastckpt().items() if tid not in native])
