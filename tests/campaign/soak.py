"""Part 6: soak — save/load cycling compressed in time. One checkpoint every 10 s for 8 hours
is 2880 saves; the soak runs that many (or fewer, CI-sized) back to back with concurrency
2-4, both formats, a load every 10 saves and the Checkpointer closed and reopened every 100
(as restarts do), and samples what must not grow: resident memory, open file descriptors,
threads, staging chunks, checkpoint directories on disk.

Samples are taken each time the Checkpointer is closed. Flat means: after the first tenth,
RSS grows by less than 64 MiB, and fds, threads and directories stay within 2 of where they
were; staging never holds more than 4 checkpoints' worth of chunks.
"""
from __future__ import annotations

import os
import time

from states import same, state_for

SAVES_PER_8H = 8 * 3600 // 10


def _sample(root: str, staging: int) -> dict:
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return {"rss_mib": rss / (1 << 20), "fds": len(os.listdir("/proc/self/fd")),
            "threads": len(os.listdir("/proc/self/task")), "staging_chunks": staging,
            "dirs": sum(1 for d in os.listdir(root) if d.startswith("step-"))}


def soak(root: str, saves: int, mib: float = 2.0) -> dict:
    """Samples are taken each time the Checkpointer is closed (every 100 saves): what a closed
    Checkpointer leaves behind is what leaks; staging is read just before the close."""
    import fastckpt
    samples, loads, bad_loads = [], 0, 0
    ck = None
    t0 = time.perf_counter()
    for i in range(saves + 1):
        if i % 100 == 0 or i == saves:
            if ck is not None:
                staging = ck._engine.pool.capacity if ck._engine is not None else 0
                ck.close()
                samples.append(dict(_sample(root, staging), save=i))
            if i == saves:
                break
            ck = fastckpt.Checkpointer(root, concurrency=2 + (i // 100) % 3, chunk_mb=1, keep=2,
                                       format=("torch", "safetensors")[(i // 100) % 2])
        ck.save(state_for(i % 50, mib=mib), step=i)
        if i % 10 == 9:
            ck.wait()
            out = ck.load()
            loads += 1
            bad_loads += not same(out, state_for(out["step"], mib=mib)) or out["step"] != (i % 50)
            del out
    return {"saves": saves, "loads": loads, "bad_loads": bad_loads, "seconds": time.perf_counter() - t0,
            "samples": samples, "mib": mib}


def judge(res: dict) -> dict:
    s = res["samples"]
    base = s[max(0, len(s) // 10)] if s else {}
    last = s[-1] if s else {}
    problems = []
    if res["bad_loads"]:
        problems.append(f"{res['bad_loads']} loads returned another state than the one saved")
    if s and last["rss_mib"] - base["rss_mib"] > 64:
        problems.append(f"RSS grew {last['rss_mib'] - base['rss_mib']:.0f} MiB after warm-up")
    for k in ("fds", "threads", "dirs"):
        if s and max(x[k] for x in s[len(s) // 10:]) > base[k] + 2:
            problems.append(f"{k} grew from {base[k]} to {max(x[k] for x in s[len(s) // 10:])}")
    bound = 4 * (int(res["mib"] * 1.3) + 2)  # concurrency <= 4 checkpoints of ~1.25 x mib in 1 MiB chunks
    if s and max(x["staging_chunks"] for x in s) > bound:
        problems.append(f"staging grew to {max(x['staging_chunks'] for x in s)} chunks")
    return {"ok": not problems, "problems": problems,
            "rss_mib": (round(base.get("rss_mib", 0), 1), round(last.get("rss_mib", 0), 1)),
            "fds": (base.get("fds"), last.get("fds")), "threads": (base.get("threads"), last.get("threads")),
            "dirs": (base.get("dirs"), last.get("dirs"))}


def run(saves: int, work: str) -> dict:
    import forked
    got = forked.call(soak, os.path.join(work, "soak"), saves, timeout=3600)
    if not got["ok"]:
        return {"ok": False, "problems": [f"{got.get('type')}: {got.get('error', '')[:500]}"], "saves": saves}
    res = got["result"]
    return dict(judge(res), saves=res["saves"], loads=res["loads"], seconds=round(res["seconds"], 1),
                hours_equivalent=round(res["saves"] / SAVES_PER_8H * 8, 2), samples=res["samples"])
