"""The reliability campaign as a benchmark: runs tests/campaign/run.py (CI-sized, or --many),
then prints and records its figures in benchmarks/RESULTS.md (its JSON and plot: benchmarks/out/).

    python benchmarks/reliability.py            # CI-sized
    python benchmarks/reliability.py --many     # 1000 kills, 1000 corruptions, 8 h-equivalent soak
    python benchmarks/reliability.py --from-json out.json   # record an earlier run's results

The campaign itself (its parts, what each checks) is tests/campaign/.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CAMPAIGN = os.path.join(os.path.dirname(HERE), "tests", "campaign")


def _summary_module():
    spec = importlib.util.spec_from_file_location("campaign_summary", os.path.join(CAMPAIGN, "summary.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


S = _summary_module()
PARTS, summary = S.PARTS, S.summary


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
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--no-results", action="store_true", help="do not touch benchmarks/RESULTS.md")
    ap.add_argument("--from-json", help="print and record the results of an earlier run's --json instead of running")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            res = json.load(f)
        for part, r in res["parts"].items():
            print(summary(part, r))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "campaign.json")
            cmd = [sys.executable, os.path.join(CAMPAIGN, "run.py"), "--parts", *args.parts, "--json", out]
            subprocess.run(cmd + (["--many"] if args.many else []), check=False)
            if not os.path.exists(out):
                print("the campaign did not finish; nothing recorded")
                return 1
            with open(out) as f:
                res = json.load(f)
    ok = all(r["ok"] for r in res["parts"].values())
    if set(res["parts"]) == set(PARTS):
        from helpers.results import keep
        cmd = "python benchmarks/reliability.py" + (" --many" if res["many"] else "")
        text = (f"## reliability.py — {res['when']}, {platform.node()} ({os.cpu_count()} cores, CPU only), `{cmd}`\n\n"
                + "\n".join(summary(p, res["parts"][p]) for p in PARTS)
                + f"\n\nAll parts as required: **{'yes' if ok else 'NO'}**.")
        keep("reliability", args.out, res, text, plot, publish=not args.no_results)
    print("ALL PARTS AS REQUIRED" if ok else "SOME PARTS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
