"""Goodput vs checkpoint interval (PCcheck Fig. 9) for fastckpt and its peers, from costs
measured by the benchmarks, replayed against a failure trace.

    python benchmarks/goodput.py [--traces benchmarks/traces/aws_spot_g4dn_bamboo.csv ...]

Costs per system come from benchmarks/out/lightning_overhead.json (the Lightning
benchmark model, same machine): the step time t without checkpoints, the stall per
checkpoint at the largest k measured (steady state), and the time to durable, read as the
final wait at k = 1 (one checkpoint in flight when training ends; torch.save is durable when
it returns). The load time of one checkpoint of that size is measured here, cold, for
torch.load, fastckpt.load and DCP's load. Concurrency: torch.save and AsyncCheckpointIO 1, fastckpt N.
DCP async_save (one in flight, as its users wait for the previous future) is priced from
benchmarks/out/save_load.json instead — the blocking call as its stall, the time to durable
as T_w, at the measured size nearest the Lightning checkpoint, scaled by bytes — since the
Lightning benchmark has no DCP row.

Traces: a real one — AWS g4dn.xlarge spot preemptions from Bamboo (NSDI'23, MIT license; see
the file's header) — and the synthetic Poisson one.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time

HERE = os.path.dirname(os.path.abspath(__file__))
from helpers import bounds  # noqa: E402
from helpers.results import keep  # noqa: E402

import torch  # noqa: E402

import fastckpt  # noqa: E402
from fastckpt.tools import goodput as gp  # noqa: E402

PEERS = {"torch": ("torch.save (TorchCheckpointIO)", 1, "torch"), "async": ("Lightning AsyncCheckpointIO", 1, "torch"),
         "fast-N1": ("fastckpt N=1", 1, "fastckpt"), "fast-N4": ("fastckpt N=4", 4, "fastckpt")}


def load_seconds(nbytes: int, work: str) -> dict:
    state = {"w": torch.randn(nbytes // 4)}
    out = {}
    import shutil

    import torch.distributed.checkpoint as dcp
    for name, save, load in (("torch", lambda p: torch.save(state, p), lambda p: torch.load(p, weights_only=True)),
                             ("fastckpt", lambda p: fastckpt.save(state, p), lambda p: fastckpt.load(p)),
                             ("dcp", lambda p: dcp.save(state, checkpoint_id=p),
                              lambda p: dcp.load({"w": torch.empty_like(state["w"])}, checkpoint_id=p))):
        path = os.path.join(work, f"load-{name}.pt")
        save(path)
        bounds.drop_folder(path)
        t0 = time.perf_counter()
        load(path)
        out[name] = time.perf_counter() - t0
        shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
    return out


def dcp_system(save_load: dict, nbytes: int, step_s: float, load_s: float) -> gp.System:
    """DCP async_save from the save/load benchmark: the measured size nearest nbytes, scaled."""
    row = min(save_load["results"], key=lambda r: abs(r["bytes"] - nbytes))
    scale = nbytes / row["bytes"]
    med = row["median_s"]
    return gp.System("DCP async_save", step_s, med["dcp_async_blocking"] * scale, med["dcp_async_durable"] * scale,
                     1, load_s)


def systems(measured: dict, loads: dict, save_load: dict) -> list[gp.System]:
    rows = measured["rows"]
    top_k = max(r["k"] for r in rows)
    out = []
    for config, (name, n, loader) in PEERS.items():
        steady = next(r for r in rows if r["config"] == config and r["k"] == top_k)
        first = next(r for r in rows if r["config"] == config and r["k"] == 1)
        stall = max(0.0, steady["stall_ms"]) / 1e3
        write = stall if config == "torch" else first["final_wait_ms"] / 1e3
        out.append(gp.System(name, measured["base"]["step"], stall, write, n, loads[loader]))
    out.append(dcp_system(save_load, measured["bounds"]["bytes"], measured["base"]["step"], loads["dcp"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measured", default=os.path.join(HERE, "out", "lightning_overhead.json"),
                    help="what benchmarks/lightning_overhead.py wrote (run it first)")
    ap.add_argument("--save-load", default=os.path.join(HERE, "out", "save_load.json"),
                    help="what benchmarks/save_load.py wrote (run it first)")
    ap.add_argument("--traces", nargs="+", default=[os.path.join(HERE, "traces", "aws_spot_g4dn_bamboo.csv"),
                                                    os.path.join(HERE, "traces", "synthetic_spot.csv")])
    ap.add_argument("--intervals", type=int, nargs="+", default=[1, 2, 5, 10, 20, 50, 100, 200, 500, 1000])
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--no-results", action="store_true")
    args = ap.parse_args()
    for path, script in ((args.measured, "lightning_overhead.py"), (args.save_load, "save_load.py")):
        if not os.path.isfile(path):
            ap.error(f"{path} is missing: run benchmarks/{script} first (its JSON is the cost measured "
                     "on this machine)")
    with open(args.measured) as f:
        measured = json.load(f)
    with open(args.save_load) as f:
        save_load = json.load(f)
    os.makedirs(args.out, exist_ok=True)
    loads = load_seconds(measured["bounds"]["bytes"], args.out)
    syss = systems(measured, loads, save_load)
    res = {"when": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "args": vars(args),
           "systems": [s.__dict__ for s in syss], "traces": []}
    for trace in args.traces:
        failures = gp.read_trace(trace)
        duration = failures[-1] if failures else 0.0
        with open(trace) as f:
            first = f.readline()
        if first.startswith("#") and "duration" in first:
            duration = float(first.split("duration")[1].split()[0])
        res["traces"].append({"trace": trace, "duration_s": duration, "failures": len(failures),
                              "rows": gp.sweep(syss, args.intervals, failures, duration)})
    text = table(res)
    print(text)
    keep("goodput", args.out, res, text, plot, publish=not args.no_results)


def plot(res: dict, path: str) -> None:
    """The first trace's goodput per interval (the real one by default)."""
    t = res["traces"][0]
    gp.plot(t["rows"], path, f"goodput, {os.path.basename(t['trace'])}: {t['failures']} failures "
                             f"in {t['duration_s'] / 3600:.1f} h")


def table(res: dict) -> str:
    names = [s["name"] for s in res["systems"]]
    lines = [f"## goodput.py — {res['when']}, {platform.node()}, `python benchmarks/goodput.py`\n",
             "Costs (from lightning_overhead.json, same machine; DCP from save_load.json, scaled to the same "
             "bytes; load measured here, cold):\n",
             "| system | step (ms) | stall per checkpoint (ms) | time to durable (ms) | N | load (ms) |",
             "|---|---|---|---|---|---|"]
    for s in res["systems"]:
        lines.append(f"| {s['name']} | {s['step_s'] * 1e3:.1f} | {s['stall_s'] * 1e3:.1f} | {s['write_s'] * 1e3:.0f} | "
                     f"{s['concurrency']} | {s['load_s'] * 1e3:.0f} |")
    for t in res["traces"]:
        rows = t["rows"]
        ivs = sorted({r["interval"] for r in rows})
        g = {(r["system"], r["interval"]): r for r in rows}
        lines += ["", f"`{os.path.relpath(t['trace'], os.path.dirname(HERE))}`: {t['failures']} failures in "
                  f"{t['duration_s'] / 3600:.1f} h. Goodput (iterations/s; ideal = no checkpoints, no failures = "
                  f"{rows[0]['ideal']:.2f}):\n", "| interval | " + " | ".join(names) + " |",
                  "|---" * (len(names) + 1) + "|"]
        for f in ivs:
            lines.append(f"| {f} | " + " | ".join(f"{g[(n, f)]['goodput']:.3f}" for n in names) + " |")
        peak = gp.peaks(rows)
        lines.append("\nPeak: " + "; ".join(f"{n} {r['goodput']:.3f} at {r['interval']} "
                                           f"({r['goodput'] / r['ideal']:.0%} of ideal)" for n, r in peak.items()))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
