"""The reliability campaign: kill -9, corruptions, faults, distributed kills, hostile files
and a soak — every figure printed, and recorded in benchmarks/RESULTS.md.

    python benchmarks/reliability.py            # CI-sized (what tests/benchmarks/test_reliability.py runs)
    python benchmarks/reliability.py --many     # 1000 kills, 1000 corruptions, 8 h-equivalent soak
    python benchmarks/reliability.py --parts kills corruptions --json out.json --no-results

Parts (benchmarks/campaign/): kills (file + pmem stores, concurrency 1-4), corruptions
(11 kinds, both formats), faults (ENOSPC / EIO / read-only; Checkpointer and Lightning;
on_error raise and warn), ranks (2-4 gloo ranks, one killed), hostile (crafted files),
soak (save/load cycling; memory, fds, threads, staging). Exit status 1 if any part fails.
This process imports torch and fastckpt but runs no thread and no tensor work: victims and
checks run in forked children.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
import torch  # noqa: E402,F401 - imported once here, so that forked children start warm

import fastckpt  # noqa: E402,F401
from campaign import corruptions, faults, hostile, kills, ranks, soak  # noqa: E402

PARTS = ("kills", "corruptions", "faults", "ranks", "hostile", "soak")
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


def _outcome(row: dict) -> str:
    if row["stopped"]:
        return "stopped: " + row["stopped"][len("stopped "):][:90] + "…"
    return f"trained every step, {row['warned']} warnings"


def summary(part: str, r: dict) -> str:
    if "skipped" in r:
        return f"- **{part}**: skipped — {r['skipped']}"
    if part == "kills":
        head = (f"{r['kills']} kill -9, **{r['unrecoverable']} unrecoverable**, {r['before_first_commit']} before "
                f"any commit; every recovery loaded at a step >= the last reported commit, bit-exact")
        rows = "".join(f"\n  - {k}: {v['kills']} kills, {v['recovered']} recovered, {v['unrecoverable']} lost, "
                       f"newest at most {v['max_steps_ahead_of_report']} steps past the last report, recovery "
                       f"{(v['median_recover_s'] or 0) * 1000:.0f} ms median" for k, v in r["by_store"].items())
        return f"- **kills**: {head}{rows}"
    if part == "corruptions":
        kinds = {}
        for k, v in r["by_kind"].items():
            kind = k.split(" ", 1)[1]
            a = kinds.setdefault(kind, [0, 0])
            a[0] += v["detected"]
            a[1] += v["trials"]
        rows = ", ".join(f"{k} {d}/{t}" for k, (d, t) in kinds.items())
        return (f"- **corruptions**: {r['corruptions']} (torch and safetensors roots), **{r['detected']} detected "
                f"({r['detected_pct']:.1f} %)** with the right fallback: {rows}")
    if part == "faults":
        rows = "".join(f"\n  - {x['fault']} / {x['mode']} / on_error={x['on_error']}: "
                       f"{'ok' if x['ok'] else 'FAILED'}, survivor step {x['survivor_step']}, "
                       f"{_outcome(x)}"
                       for x in r["rows"])
        return f"- **faults**: {r['passed']}/{r['runs']} runs as configured, nothing committed lost{rows}"
    if part == "ranks":
        rows = "; ".join(f"{k}: {v['resumed_same_step']}/{v['rounds']}" for k, v in r["by_world"].items())
        return (f"- **ranks**: {r['rounds']} rounds (one random rank killed), **{r['resumed_same_step']} resumed every "
                f"rank from the same step** (>= last reported commit, bit-exact, and saved again): {rows}")
    if part == "hostile":
        unsafe = sum(1 for v in r["by_case"].values() if not v["verify_flagged"])
        return (f"- **hostile**: {r['cases']} crafted files, **{r['rejected']} rejected** with a fastckpt error by "
                f"every load (mapped and copied); `fastckpt verify` flags {r['cases'] - unsafe} and names the "
                f"other {unsafe} (intact files whose pickle asks for a global off the allowlist) UNSAFE; payload "
                f"executed {r['code_executed']} times; none killed, timed out or out of memory under a 1 GiB "
                f"address-space limit")
    return (f"- **soak**: {r['saves']} saves + {r.get('loads')} loads ({r.get('hours_equivalent')} h-equivalent at one "
            f"checkpoint per 10 s) in {r.get('seconds')} s: RSS {r.get('rss_mib')} MiB, fds {r.get('fds')}, "
            f"threads {r.get('threads')}, checkpoint dirs {r.get('dirs')} (after warm-up, at the end) — "
            f"{'flat' if r['ok'] else 'NOT flat: ' + '; '.join(r['problems'])}")


def plot(res: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    parts = [p for p in PARTS if p in res["parts"] and "skipped" not in res["parts"][p] and p != "soak"]
    totals = {"kills": ("kills", "unrecoverable", True), "corruptions": ("corruptions", "detected", False),
              "faults": ("runs", "passed", False), "ranks": ("rounds", "resumed_same_step", False),
              "hostile": ("cases", "rejected", False)}
    pct = []
    for p in parts:
        total, good, inverse = totals[p]
        r = res["parts"][p]
        pct.append(100.0 * ((r[total] - r[good]) if inverse else r[good]) / max(1, r[total]))
    a.bar(parts, pct, color="tab:green")
    a.set_ylim(0, 105)
    a.set_ylabel("% as required")
    a.set_title("campaign parts")
    s = res["parts"].get("soak", {}).get("samples", [])
    if s:
        b.plot([x["save"] for x in s], [x["rss_mib"] for x in s], label="RSS MiB")
        b.plot([x["save"] for x in s], [x["threads"] * 10 for x in s], label="threads x10")
        b.plot([x["save"] for x in s], [x["fds"] * 10 for x in s], label="fds x10")
        b.set_xlabel("saves")
        b.legend()
        b.set_title("soak (sampled at each close)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--many", action="store_true", help="the full campaign (1000 kills, 1000 corruptions, ...)")
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--no-results", action="store_true", help="do not touch benchmarks/RESULTS.md and figures/")
    ap.add_argument("--from-json", help="print and record the results of an earlier --json run instead of running")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            res = json.load(f)
        return report(res, args)
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
    return report(res, args)


def report(res: dict, args) -> int:
    ok = all(r["ok"] for r in res["parts"].values())
    if args.from_json:
        for part, r in res["parts"].items():
            print(summary(part, r))
    if set(res["parts"]) == set(PARTS):
        from results import keep
        cmd = "python benchmarks/reliability.py" + (" --many" if res["many"] else "")
        text = (f"## reliability.py — {res['when']}, {platform.node()} ({os.cpu_count()} cores, CPU only), `{cmd}`\n\n"
                + "\n".join(summary(p, res["parts"][p]) for p in PARTS)
                + f"\n\nAll parts as required: **{'yes' if ok else 'NO'}**.")
        keep("reliability", args.out, res, text, plot, publish=not args.no_results)
    print("ALL PARTS AS REQUIRED" if ok else "SOME PARTS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
