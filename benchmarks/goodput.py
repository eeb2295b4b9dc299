"""Goodput vs checkpoint interval (PCcheck Fig. 9) for fastckpt and its peers, from costs
measured by the benchmarks, replayed against a failure trace.

    python benchmarks/goodput.py [--trace benchmarks/traces/synthetic_spot.csv]

Costs per system come from benchmarks/figures/lightning_overhead.json (the Lightning
benchmark model, same machine): the step time t without checkpoints, the stall per
checkpoint at the largest k measured (steady state), and the time to durable, read as the
final wait at k = 1 (one checkpoint in flight when training ends; torch.save is durable when
it returns). The load time of one checkpoint of that size is measured here, cold, for
torch.load and fastckpt.load. Concurrency: torch.save and AsyncCheckpointIO 1, fastckpt N.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))
import bounds  # noqa: E402
from results import keep  # noqa: E402

import torch  # noqa: E402

import fastckpt  # noqa: E402
from fastckpt import goodput as gp  # noqa: E402

PEERS = {"torch": ("torch.save (TorchCheckpointIO)", 1, "torch"), "async": ("Lightning AsyncCheckpointIO", 1, "torch"),
         "fast-N1": ("fastckpt N=1", 1, "fastckpt"), "fast-N4": ("fastckpt N=4", 4, "fastckpt")}


def load_seconds(nbytes: int, work: str) -> dict:
    state = {"w": torch.randn(nbytes // 4)}
    out = {}
    for name, save, load in (("torch", lambda p: torch.save(state, p), lambda p: torch.load(p, weights_only=True)),
                             ("fastckpt", lambda p: fastckpt.save(state, p), lambda p: fastckpt.load(p))):
        path = os.path.join(work, f"load-{name}.pt")
        save(path)
        bounds.drop_cache(path)
        t0 = time.perf_counter()
        load(path)
        out[name] = time.perf_counter() - t0
        os.unlink(path)
    return out


def systems(measured: dict, loads: dict) -> list[gp.System]:
    rows = measured["rows"]
    top_k = max(r["k"] for r in rows)
    out = []
    for config, (name, n, loader) in PEERS.items():
        steady = next(r for r in rows if r["config"] == config and r["k"] == top_k)
        first = next(r for r in rows if r["config"] == config and r["k"] == 1)
        stall = max(0.0, steady["stall_ms"]) / 1e3
        write = stall if config == "torch" else first["final_wait_ms"] / 1e3
        out.append(gp.System(name, measured["base"]["step"], stall, write, n, loads[loader]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measured", default=os.path.join(HERE, "figures", "lightning_overhead.json"))
    ap.add_argument("--trace", default=os.path.join(HERE, "traces", "synthetic_spot.csv"))
    ap.add_argument("--intervals", type=int, nargs="+", default=[1, 2, 5, 10, 20, 50, 100, 200, 500, 1000])
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--no-results", action="store_true")
    args = ap.parse_args()
    with open(args.measured) as f:
        measured = json.load(f)
    os.makedirs(args.out, exist_ok=True)
    loads = load_seconds(measured["bounds"]["bytes"], args.out)
    syss = systems(measured, loads)
    failures = gp.read_trace(args.trace)
    duration = failures[-1] if failures else 0.0
    with open(args.trace) as f:
        first = f.readline()
    if first.startswith("#") and "duration" in first:
        duration = float(first.split("duration")[1].split()[0])
    rows = gp.sweep(syss, args.intervals, failures, duration)
    res = {"when": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "args": vars(args), "duration_s": duration,
           "failures": len(failures), "systems": [s.__dict__ for s in syss], "rows": rows}
    text = table(res)
    print(text)
    keep("goodput", args.out, res, text, lambda r, p: gp.plot(r["rows"], p, f"goodput, {len(failures)} failures "
                                                                            f"in {duration / 3600:.0f} h"),
         publish=not args.no_results)


def table(res: dict) -> str:
    names = [s["name"] for s in res["systems"]]
    ivs = sorted({r["interval"] for r in res["rows"]})
    g = {(r["system"], r["interval"]): r for r in res["rows"]}
    lines = [f"## goodput.py — {res['when']}, {platform.node()}, `python benchmarks/goodput.py` "
             f"({res['failures']} failures in {res['duration_s'] / 3600:.1f} h, `{os.path.relpath(res['args']['trace'], os.path.dirname(HERE))}`)\n",
             "Costs (from lightning_overhead.json, same machine; load measured here, cold):\n",
             "| system | step (ms) | stall per checkpoint (ms) | time to durable (ms) | N | load (ms) |",
             "|---|---|---|---|---|---|"]
    for s in res["systems"]:
        lines.append(f"| {s['name']} | {s['step_s'] * 1e3:.1f} | {s['stall_s'] * 1e3:.1f} | {s['write_s'] * 1e3:.0f} | "
                     f"{s['concurrency']} | {s['load_s'] * 1e3:.0f} |")
    lines += ["", "Goodput (iterations/s; ideal = no checkpoints, no failures = "
              f"{res['rows'][0]['ideal']:.2f}):\n", "| interval | " + " | ".join(names) + " |",
              "|---" * (len(names) + 1) + "|"]
    for f in ivs:
        lines.append(f"| {f} | " + " | ".join(f"{g[(n, f)]['goodput']:.3f}" for n in names) + " |")
    peak = gp.peaks(res["rows"])
    lines.append("\nPeak: " + "; ".join(f"{n} {r['goodput']:.3f} at {r['interval']} ({r['goodput'] / r['ideal']:.0%} "
                                       f"of ideal)" for n, r in peak.items()))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
