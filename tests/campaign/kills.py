"""Part 1: kill -9 at random moments while a writer checkpoints, on the root store (torch and
safetensors formats) and the PMEM store (a pool on /dev/shm), concurrency 1-4.

After each kill a fresh child opens the store as a restarted job would: the newest valid
checkpoint must exist once any commit was reported, be at a step >= the last reported
commit, load with every CRC checked, and equal the state saved at that step bit for bit.
"""
from __future__ import annotations

import os
import random
import statistics
import time

import forked
from states import same, state_for

PERSIST = ("msync", "fence", "auto")


def store_kwargs(store: str, i: int) -> dict:
    if store == "pmem":
        return {"store": "pmem", "model": "m", "pool_mb": 64, "persist": PERSIST[i % 3]}
    return {"format": ("torch", "safetensors")[(i // 2) % 2]}


def _writer(emit, root: str, concurrency: int, kwargs: dict) -> None:
    import fastckpt
    ck = fastckpt.Checkpointer(root, concurrency=concurrency, chunk_mb=1, keep=2, writers=2, **kwargs)
    latest = ck.latest()
    step = latest.step + 1 if latest else 1
    emit("ready")
    pending = []
    while True:
        pending.append(ck.save(state_for(step), step=step))
        step += 1
        while pending and (len(pending) >= concurrency or pending[0].done()):
            emit(f"committed {pending.pop(0).wait().step}")


def _recover(root: str, kwargs: dict) -> dict:
    import contextlib
    import io

    import fastckpt
    from fastckpt.tools.cli import main as cli_main
    t0 = time.perf_counter()
    read = {k: v for k, v in kwargs.items() if k in ("store", "model")}
    with fastckpt.Checkpointer(root, **read) as ck:
        info = ck.latest()
        if info is None:
            return {"step": None}
        out = ck.load()
        took = time.perf_counter() - t0
        ok = same(out, state_for(info.step))
    with contextlib.redirect_stdout(io.StringIO()):
        verified = cli_main(["verify", root]) == 0
    return {"step": info.step, "same": ok, "verify": verified, "recover_s": took}


def run(n: int, work: str, shm: str, seed: int = 1, max_delay: float = 0.4) -> dict:
    rng = random.Random(seed)
    roots = {"root": os.path.join(work, "kills-root"), "pmem": os.path.join(shm, "kills.pool")}
    best = {"root": 0, "pmem": 0}
    rows: dict = {}
    failures = []
    for i in range(n):
        store = ("root", "pmem")[i % 2]
        concurrency = 1 + (i // 2) % 4
        kwargs = store_kwargs(store, i // 2)
        lines = forked.kill_during(_writer, (roots[store], concurrency, kwargs), rng.uniform(0, max_delay))
        errors = [x for x in lines if x.startswith("error")]
        reported = max([int(x.split()[1]) for x in lines if x.startswith("committed")], default=0)
        best[store] = max(best[store], reported)
        got = forked.call(_recover, roots[store], kwargs, timeout=120)
        row = rows.setdefault(f"{store} c={concurrency}", {"kills": 0, "recovered": 0, "unrecoverable": 0,
                                                           "ahead": [], "recover_s": []})
        row["kills"] += 1
        res = got.get("result") or {}
        step = res.get("step")
        bad = None
        if errors:
            bad = f"the writer failed by itself: {errors[0][:300]}"
        elif not got["ok"]:
            bad = f"recovery raised {got.get('type')}: {got.get('error', '')[:300]}"
        elif step is None:
            bad = None if best[store] == 0 else f"no checkpoint although step {best[store]} was committed"
        elif step < best[store]:
            bad = f"recovered step {step} < reported committed {best[store]}"
        elif not res["same"]:
            bad = f"step {step} loaded but differs from what was saved"
        elif not res["verify"]:
            bad = "fastckpt verify flagged the root"
        if bad is not None:
            row["unrecoverable"] += 1
            failures.append(f"kill {i} ({store}, concurrency {concurrency}): {bad}")
        elif step is not None:
            row["recovered"] += 1
            row["ahead"].append(step - best[store])
            row["recover_s"].append(res["recover_s"])
            best[store] = step
    table = {k: {"kills": r["kills"], "recovered": r["recovered"], "unrecoverable": r["unrecoverable"],
                 "max_steps_ahead_of_report": max(r["ahead"], default=0),
                 "median_recover_s": statistics.median(r["recover_s"]) if r["recover_s"] else None}
             for k, r in sorted(rows.items())}
    return {"kills": n, "unrecoverable": sum(r["unrecoverable"] for r in rows.values()),
            "before_first_commit": n - sum(r["recovered"] + r["unrecoverable"] for r in rows.values()),
            "final_steps": best, "by_store": table, "failures": failures[:20]}
