"""The memory part of benchmarks/offload.py: the largest batch of a deep CPU model that
trains under a memory cap, with and without activation offload, and its time per step.

Each trial is a fresh process (offload_child.py) in a fresh cap (memcap.py: a memory
cgroup, page cache included, else RLIMIT_AS); it fits when it trains `steps` steps and
exits 0. The search doubles the batch from `start` until a trial fails, then bisects
down to `resolution` of the last fitting batch.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from .memcap import MemoryCap

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "offload_child.py")


def baseline_vm_mb() -> int:
    """Address space of a child that has imported torch and fastckpt (for the RLIMIT_AS fallback)."""
    code = ("import torch, fastckpt.offload; print([l for l in open('/proc/self/status') "
            "if l.startswith('VmSize')][0].split()[1])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return int(out.strip()) // 1024


def trial(batch: int, offload: str, cap_mb: int, work_dir: str, extra: list[str], vm_mb: int) -> dict | None:
    """One capped run; its JSON result (with the cap's peak) or None when it did not fit."""
    with MemoryCap(cap_mb, vm_mb) as cap:
        proc = subprocess.run([sys.executable, CHILD, "--batch", str(batch), "--offload", offload, "--dir", work_dir,
                               *extra], preexec_fn=cap.enter, capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(HERE))))
        peak = cap.peak_mb()
        kind = cap.kind
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    ok = proc.returncode == 0 and lines
    why = "fits" if ok else (f"killed by signal {-proc.returncode}" if proc.returncode < 0 else
                             (proc.stderr.strip().splitlines() or ["exit %d" % proc.returncode])[-1][:120])
    print(f"    batch {batch:>6} offload {offload:<3} under {cap_mb} MiB ({kind}): {why}", flush=True)
    if not ok:
        return None
    res = json.loads(lines[-1])
    res.update(cap_peak_mb=peak, cap_kind=kind)
    return res


def largest_batch(offload: str, cap_mb: int, work_dir: str, extra: list[str], start: int,
                  resolution: float, vm_mb: int) -> tuple[int, dict | None]:
    fit, fit_res, fail = 0, None, None
    b = start
    while fail is None:
        r = trial(b, offload, cap_mb, work_dir, extra, vm_mb)
        if r is None:
            fail = b
        else:
            fit, fit_res, b = b, r, b * 2
    while fit and fail - fit > max(64, int(fit * resolution)):
        mid = (fit + fail) // 2 // 64 * 64
        r = trial(mid, offload, cap_mb, work_dir, extra, vm_mb)
        if r is None:
            fail = mid
        else:
            fit, fit_res = mid, r
    return fit, fit_res


def run(cap_mb: int, work_dir: str, depth: int, width: int, steps: int, start: int, resolution: float,
        inflight_mb: float, threshold_mb: float) -> dict:
    extra = ["--depth", str(depth), "--width", str(width), "--steps", str(steps), "--inflight-mb", str(inflight_mb),
             "--threshold-mb", str(threshold_mb)]
    vm_mb = baseline_vm_mb()
    out = {"cap_mb": cap_mb, "depth": depth, "width": width, "steps": steps, "inflight_mb": inflight_mb,
           "threshold_mb": threshold_mb, "activation_bytes_per_sample": depth * 3 * width * 4}
    for mode in ("off", "on"):
        print(f"  largest batch, offload {mode}:", flush=True)
        out[f"max_batch_{mode}"], out[f"at_max_{mode}"] = largest_batch(mode, cap_mb, work_dir, extra, start,
                                                                       resolution, vm_mb)
    b = out["max_batch_off"]
    if b:
        print(f"  offload on at the batch that fits without it ({b}):", flush=True)
        out["on_at_max_off"] = trial(b, "on", cap_mb, work_dir, extra, vm_mb)
    return out
