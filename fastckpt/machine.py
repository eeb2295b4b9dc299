"""What this machine has for fastckpt to size itself by: the CPUs this process may run on,
and its physical memory."""
from __future__ import annotations

import os


def hardware_threads() -> int:
    """CPUs this process may run on (its affinity), at least 1."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


# Reads a cold load keeps in flight. A read waits on the device, not on a CPU: on this project's
# 2-CPU VM, benchmarks/dcp.py's first load of a process (2 ranks, 15 items of 32 MiB a rank) took
# 1.0-1.2 s with 2 reader threads, 0.85-1.04 with 4, 0.71-0.86 with 8 and 0.58-0.62 with 16, as
# fast as a later load; DCP's own reader took 0.67-0.81 s in the same runs.
READERS = 16


def read_threads() -> int:
    """Threads reading a file from its disk at once: READERS, or the CPUs where there are more
    (a read from memory is a copy and a CRC: CPU work)."""
    return max(READERS, hardware_threads())


def physical_memory() -> int:
    """Bytes of physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def available_memory() -> int:
    """Bytes of physical memory free now."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
