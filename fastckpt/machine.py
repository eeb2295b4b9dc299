"""What this machine has for fastckpt to size itself by: the CPUs this process may run on,
and its physical memory."""
from __future__ import annotations

import os


def hardware_threads() -> int:
    """CPUs this process may run on (its affinity), at least 1."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def physical_memory() -> int:
    """Bytes of physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
