"""A memory cap for one child process: a fresh memory cgroup (v2 memory.max, or v1
memory.limit_in_bytes, page cache included) where this user may make one, else RLIMIT_AS.

    with MemoryCap(1024) as cap:
        proc = subprocess.run(cmd, preexec_fn=cap.enter, ...)
        cap.peak_mb()      # the cgroup's peak usage (None under RLIMIT_AS)
An exit by SIGKILL (the cgroup's OOM killer) or a MemoryError means "does not fit".
"""
from __future__ import annotations

import os
import resource
import time

V2 = "/sys/fs/cgroup"
V1 = "/sys/fs/cgroup/memory"


class MemoryCap:
    def __init__(self, mb: int, baseline_vm_mb: int = 0):
        self.mb, self.baseline_vm_mb = mb, baseline_vm_mb
        self.path: str | None = None
        self.kind = "rlimit_as"

    def __enter__(self) -> "MemoryCap":
        name = f"fastckpt-bench-{os.getpid()}-{time.monotonic_ns()}"
        limit = str(self.mb << 20)
        for root, files in ((V2, ("memory.max",)), (V1, ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"))):
            if not os.path.exists(os.path.join(root, files[0] if root == V1 else "cgroup.controllers")):
                continue
            if root == V2 and "memory" not in open(os.path.join(V2, "cgroup.controllers")).read():
                continue
            path = os.path.join(root, name)
            try:
                os.mkdir(path)
                for f in files:
                    if os.path.exists(os.path.join(path, f)):
                        with open(os.path.join(path, f), "w") as fh:
                            fh.write(limit)
            except OSError:
                if os.path.isdir(path):
                    os.rmdir(path)
                continue
            self.path, self.kind = path, "cgroup-v2" if root == V2 else "cgroup-v1"
            break
        return self

    def enter(self) -> None:
        """preexec_fn of the child: joins the cgroup, or sets RLIMIT_AS."""
        if self.path is not None:
            with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        else:
            cap = (self.mb + self.baseline_vm_mb) << 20
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    def peak_mb(self) -> float | None:
        if self.path is None:
            return None
        for f in ("memory.peak", "memory.max_usage_in_bytes"):
            p = os.path.join(self.path, f)
            if os.path.exists(p):
                return int(open(p).read()) / (1 << 20)
        return None

    def __exit__(self, *exc) -> None:
        if self.path is not None:
            for _ in range(50):
                try:
                    os.rmdir(self.path)
                    break
                except OSError:
                    time.sleep(0.1)
