"""One CPU training run for benchmarks/offload.py, meant to run under a memory cap.

    python offload_child.py --batch B --offload on|off --dir D [--depth 24 --width 512 --steps 3]

Trains a deep model (blocks of Linear -> GELU -> LayerNorm, SGD) for a few steps with or
without activation offload, and prints one JSON line: seconds per step (the first step,
which also learns the tool dictionaries, is reported apart), peak resident memory
(ru_maxrss) and the offload counts. The parent decides the cap (cgroup or RLIMIT_AS) and
reads an exit by OOM kill or MemoryError as "does not fit".
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import torch


def deep_model(depth: int, width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    blocks = []
    for _ in range(depth):
        blocks += [torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.LayerNorm(width)]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(width, 16))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--offload", choices=("on", "off"), required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--depth", type=int, default=24)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threshold-mb", type=float, default=1.0)
    ap.add_argument("--inflight-mb", type=float, default=64.0)
    ap.add_argument("--mode", default="aware")
    ap.add_argument("--tool", default=None)
    a = ap.parse_args()
    torch.set_num_threads(2)
    model = deep_model(a.depth, a.width)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(a.batch, a.width, generator=g)
    y = torch.randint(0, 16, (a.batch,), generator=g)
    off = None
    if a.offload == "on":
        from fastckpt.offload import ActivationOffload, TensorIO
        io = TensorIO(mode=a.mode, aware="wr", tool=a.tool)
        off = ActivationOffload(a.dir, threshold_mb=a.threshold_mb, io=io, max_inflight_mb=a.inflight_mb)
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        if off is None:
            torch.nn.functional.cross_entropy(model(x), y).backward()
        else:
            with off:
                torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    out = {"batch": a.batch, "steps": a.steps, "offload": a.offload, "first_step_s": times[0], "step_s": sorted(times[1:])[len(times[1:]) // 2]
           if len(times) > 1 else times[0], "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "offloaded": off.stats if off is not None else None,
           "tools": sorted({t for e in off.io.wdic.values() for t in e}) if off is not None else None}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
