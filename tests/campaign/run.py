"""The reliability campaign: kill -9, corruptions, faults, distributed kills, hostile files and
a soak, each part a module here (`run(...) -> dict` of counts).

    python tests/campaign/run.py            # CI-sized (tests/campaign/test_campaign.py runs each part)
    python tests/campaign/run.py --many     # 1000 kills, 1000 corruptions, 8 h-equivalent soak
    python tests/campaign/run.py --parts kills corruptions --json out.json

Parts: kills (file + pmem stores, concurrency 1-4), corruptions (11 kinds, both formats),
faults (ENOSPC / EIO / read-only; Checkpointer and Lightning; on_error raise and warn), ranks
(2-4 gloo ranks, one killed), hostile (crafted files), soak (save/load cycling; memory, fds,
threads, staging). Exit status 1 if any part fails. Parts that kill or crash run their victims
as forked children of this process, which imports torch and fastckpt but never runs a thread
or tensor work, so a kill costs milliseconds instead of an interpreter start.
`python benchmarks/reliability.py` runs this and records its figures in benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time

import torch  # noqa: F401 - imported once here, so that forked children start warm

import fastckpt  # noqa: F401
import corruptions
import faults
import hostile
import kills
import ranks
import soak
from summary import PARTS, summary

SIZES = {False: {"kills": 24, "corruptions": 110, "rounds": 1, "worlds": (2, 3), "saves": 300},
         True: {"kills": 1000, "corruptions": 1000, "rounds": 8, "worlds": (2, 3, 4), "saves": soak.SAVES_PER_8H}}


def run_part(part: str, many: bool, work: str, shm: str) -> dict:
    n = SIZES[many]
    if part == "kills":
        r = kills.run(n["kills"], work, shm)
        return dict(r, ok=r["unrecoverable"] == 0)
    if part == "corruptions":
        r = corruptions.run(n["corruptions"], work)
        return dict(r, ok=r["detected"] == r["corruptions"])
    if part == "faults":
        r = faults.run(work)
        return dict(r, ok=r["passed"] == r["runs"])
    if part == "ranks":
        r = ranks.run(n["rounds"], work, worlds=n["worlds"])
        return dict(r, ok=r["resumed_same_step"] == r["rounds"])
    if part == "hostile":
        r = hostile.run(work)
        return dict(r, ok=r["rejected"] == r["cases"])
    return soak.run(n["saves"], work)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--many", action="store_true", help="the full campaign (1000 kills, 1000 corruptions, ...)")
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="fastckpt-campaign-")
    shm = tempfile.mkdtemp(prefix="fastckpt-campaign-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    res = {"when": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "many": args.many, "parts": {}}
    try:
        for part in args.parts:
            t0 = time.perf_counter()
            try:
                r = run_part(part, args.many, work, shm)
            except PermissionError as e:  # the faults part needs root for its mounts
                r = {"ok": True, "skipped": str(e)}
            r["seconds_total"] = round(time.perf_counter() - t0, 1)
            res["parts"][part] = r
            print(summary(part, r), flush=True)
            for line in r.get("failures", []) + r.get("problems", []):
                print(f"    FAILED: {line}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    ok = all(r["ok"] for r in res["parts"].values())
    print("ALL PARTS AS REQUIRED" if ok else "SOME PARTS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
