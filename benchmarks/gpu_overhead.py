"""Training overhead of checkpointing on one GPU: fastckpt against DCP, Lightning and DeepSpeed, one run.

Every contender (contenders.py) trains the same model in a process of its own (a fresh
interpreter on a GPU; without one, forked from this driver after its imports: helpers/fresh.py) — the plain loop
(no checkpoint, torch.save + fsync, DCP async_save with its default staging and with a
pinned asynchronous DefaultStager, fastckpt c / g / d), Lightning (TorchCheckpointIO,
AsyncCheckpointIO, FastCheckpointIO, FastCheckpointIO + LayerwiseCheckpointing) and
DeepSpeed ZeRO-2 (default engine, "fastckpt" entry) — at several checkpoint intervals:
the one where the disk just keeps up (k = the O_DIRECT write time of one checkpoint over a
step), half of it and twice it (or --ks).

Measured in the same run: the bounds — the device→pinned copy of the state and an O_DIRECT
write of its bytes. Per contender and interval (medians of --runs rounds; each round runs
every configuration once):
- save call: median time inside save() after the first (and the first apart);
- stall per checkpoint: the time the steady-state steps lost over the run's own quiet
  baseline, per checkpoint;
- first checkpoint: what the first interval lost (staging allocated, threads started);
- overhead: steady state (after the first interval) and whole run (every measured step);
- drain: the wait after the last step until every checkpoint is durable;
- where fastckpt's save went (its own contenders): each phase of fastckpt.timings, as the mean
  per save after the first (Checkpointer.stats), the median over the rounds — the save call's
  parts, the gate's wait, the background copy, CRC and write (summed over their threads), the
  commit, and the instants copied / durable counted from the save call.

On a GPU: bf16 autocast, fp32 AdamW, a 403 M-parameter LM (d=2048, 8 layers) by default.
Without one it runs on CPU with whatever model is given (the suite runs it tiny, so it
never rots). A contender that does not finish within --child-timeout is reported as HANG.

    python benchmarks/gpu_overhead.py                                   # everything (GPU: ~20 min)
    python benchmarks/gpu_overhead.py --contenders none fast_c dcp_stager --ks 40 80 --runs 3
    python benchmarks/gpu_overhead.py --merge out/a.json out/b.json     # one table of several calls
                                                    # (b's rows replace a's of the same contender and k)
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
from helpers import contenders, fresh  # noqa: E402
from helpers.results import keep  # noqa: E402

TARGETS = "steady ≤ 3 %, whole run ≤ 5 %, stall ≤ 0.5 × copy bound, save call ≤ 20 ms"


def child(args, name: str, k: int) -> dict:
    """One run of one contender in a process of its own (helpers/fresh.py); {'error': ...} when it
    failed or hung."""
    try:
        out = fresh.run(os.path.abspath(__file__), [*sys.argv[1:], "--one", name, str(k)], main, args.child_timeout,
                        env={"MASTER_PORT": str(free_port())}, preload=preload(args))
    except subprocess.TimeoutExpired:
        return {"error": f"HANG (no end within {args.child_timeout} s)"}
    if out.returncode != 0:
        tail = (out.stdout + out.stderr).strip().splitlines()[-12:]
        return {"error": f"exit {out.returncode}: " + " | ".join(tail)[-1500:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def preload(args) -> list[str]:
    """What a forked child finds imported (helpers/fresh.py): the frameworks its contenders train with."""
    return [m for m, prefix in (("lightning.pytorch", "l_"), ("deepspeed", "ds_"))
            if any(c.startswith(prefix) for c in args.contenders)]


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(a, run: dict, k: int) -> dict:
    """One run's figures from its step times (warm-up already dropped)."""
    times = run["times"]
    quiet, measured = times[:a.quiet], times[a.quiet:]
    base = statistics.median(quiet)
    first, steady = measured[:k], measured[k:]
    saves_steady = max(1, len(run["calls"]) - 1)
    lost_steady = sum(steady) - base * len(steady)
    return {"base_ms": base * 1e3, "save_first_ms": run["calls"][0] * 1e3 if run["calls"] else 0.0,
            "save_ms": statistics.median(run["calls"][1:]) * 1e3 if len(run["calls"]) > 1 else 0.0,
            "stall_ms": lost_steady / saves_steady * 1e3, "first_s": sum(first) - base * len(first),
            "steady_pct": (sum(steady) / (base * len(steady)) - 1) * 100,
            "whole_pct": (sum(measured) / (base * len(measured)) - 1) * 100, "drain_s": run["drain"]}


def summarize(a, name: str, k: int, runs: list[dict]) -> dict:
    good = [r for r in runs if "error" not in r]
    row = {"contender": name, "k": k, "runs": runs, "errors": [r["error"] for r in runs if "error" in r]}
    if good:
        per = [metrics(a, r, k) for r in good]
        for key in per[0]:
            row[key] = statistics.median(m[key] for m in per)
        row["bytes"] = good[0]["bytes"]
        row["checked"] = all(r["checked"] for r in good)
        row["stager_fresh"] = next((r["stager_fresh"] for r in good if r.get("stager_fresh")), None)
        timed = [r["phases"]["steady"] for r in good if r.get("phases", {}).get("steady")]
        if timed:
            row["phases"] = {p: statistics.median(t.get(p, 0.0) for t in timed) for p in set().union(*timed)}
    return row


def intervals(args, probe: dict, write_s: float) -> list[int]:
    if args.ks:
        return args.ks
    keep_up = max(1, math.ceil(write_s / (probe["base_ms"] / 1e3)))
    if args.pace_only:
        return [keep_up]
    return sorted({max(1, keep_up // 2), keep_up, 2 * keep_up})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    gpu = contenders.device().type == "cuda"
    ap.add_argument("--d-model", type=int, default=2048 if gpu else 256)
    ap.add_argument("--layers", type=int, default=8 if gpu else 4)
    ap.add_argument("--ds-layers", type=int, default=4 if gpu else 2, help="layers of the DeepSpeed model")
    ap.add_argument("--heads", type=int, default=16 if gpu else 4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=1024 if gpu else 64)
    ap.add_argument("--batch", type=int, default=8 if gpu else 2)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--contenders", nargs="+", default=list(contenders.ALL), choices=contenders.ALL)
    ap.add_argument("--ks", type=int, nargs="+", help="checkpoint every k steps (default: around the disk's pace)")
    ap.add_argument("--intervals", type=int, default=5, help="checkpoints per run")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--quiet", type=int, default=20, help="steps without checkpoints: the run's baseline")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--child-timeout", type=float, default=600)
    ap.add_argument("--pace-only", action="store_true", help="only the interval where the disk just keeps up")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--scratch", help="folder for the checkpoints and the write bound's file (default: --out)")
    ap.add_argument("--no-results", action="store_true")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="only render the table of saved runs, merged")
    ap.add_argument("--one", nargs=2, metavar=("CONTENDER", "K"), help=argparse.SUPPRESS)
    ap.add_argument("--bound", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.scratch = args.scratch or args.out
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.scratch, exist_ok=True)
    if args.one:  # a child: one run, its result as the last line
        name, k = args.one[0], int(args.one[1])
        print(json.dumps(contenders.run(args, name, k, os.path.join(args.scratch, f"gpu-ckpt-{name}"))), flush=True)
        return
    if args.bound:
        print(json.dumps(contenders.copy_bound(args)), flush=True)
        return
    if args.merge:
        res = merged(args.merge)
    else:
        res = measure(args)
    text = table(res)
    print(text)
    keep("gpu_overhead", args.out, res, text, plot, publish=not args.no_results)


def measure(args) -> dict:
    from helpers import bounds
    import torch
    out = fresh.run(os.path.abspath(__file__), [*sys.argv[1:], "--bound"], main, args.child_timeout)
    if out.returncode != 0:
        raise SystemExit(f"the copy bound's run failed (exit {out.returncode}): {out.stderr[-2000:]}")
    copy = json.loads(out.stdout.strip().splitlines()[-1])
    scratch = os.path.join(args.scratch, "bound.bin")
    write_s = bounds.direct_write_seconds(scratch, copy["bytes"])
    os.unlink(scratch)
    probe_args = [r for r in [child(args, "none", 1)] if "error" not in r]
    if not probe_args:
        raise SystemExit("the run without checkpoints failed: nothing to measure against")
    probe = metrics(args, probe_args[0], 1)
    ks = intervals(args, probe, write_s)
    print(f"step {probe['base_ms']:.1f} ms, state {copy['bytes'] / 2**30:.2f} GiB, copy bound "
          f"{copy['copy_s'] * 1e3:.0f} ms, O_DIRECT write {write_s:.2f} s -> intervals {ks}", flush=True)
    plan = [(name, k) for k in ks for name in args.contenders]
    runs_of: dict = {key: [] for key in plan}
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU only ({os.cpu_count()} cores)"

    def result() -> dict:
        return {"when": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "device": dev, "host": platform.node(),
                "torch": torch.__version__, "cuda": torch.version.cuda,
                "args": {k: v for k, v in vars(args).items() if k not in ("one", "bound")},
                "bounds": {"copy_s": copy["copy_s"], "direct_write_s": write_s, "bytes": copy["bytes"],
                           "params": copy["params"]},
                "ks": ks, "rows": [summarize(args, name, k, runs_of[(name, k)]) for name, k in plan if runs_of[(name, k)]]}

    for r in range(args.runs):
        for name, k in plan:
            got = child(args, name, k)
            runs_of[(name, k)].append(got)
            print(f"  {name:<12} k={k:<4} " + (got["error"] if "error" in got else
                  f"{sum(got['times']):.2f} s, {len(got['calls'])} saves, drain {got['drain']:.2f} s"), flush=True)
            # what is measured so far, for a run stopped before its end (render it with --merge)
            with open(os.path.join(args.out, "gpu_overhead.partial.json"), "w") as f:
                json.dump(result(), f)
        print(f"round {r + 1}/{args.runs} done", flush=True)
    os.unlink(os.path.join(args.out, "gpu_overhead.partial.json"))
    return result()


def merged(paths: list[str]) -> dict:
    parts = [json.load(open(p)) for p in paths]
    res = dict(parts[0])
    rows: dict = {}  # a later run of a contender at the same interval (a rerun after a fix) replaces it
    for part in parts:
        rows.update({(row["contender"], row["k"]): row for row in part["rows"]})
    res["rows"] = list(rows.values())
    res["ks"] = sorted({row["k"] for row in res["rows"]})
    res["merged_from"] = [f"{p['when']} ({', '.join(sorted({r['contender'] for r in p['rows']}))})" for p in parts]
    return res


def table(res: dict) -> str:
    a, b = res["args"], res["bounds"]
    head = (f"## gpu_overhead.py — {res['when']}, {res['device']}, torch {res['torch']}, "
            f"`--d-model {a['d_model']} --layers {a['layers']} --seq {a['seq']} --batch {a['batch']} "
            f"--runs {a['runs']}`\n\n"
            f"{b['params'] / 1e6:.0f} M parameters; one plain-loop checkpoint (weights + AdamW moments) "
            f"{b['bytes'] / 2**30:.2f} GiB. Bounds, same run: device→pinned copy {b['copy_s'] * 1e3:.0f} ms, "
            f"O_DIRECT write {b['direct_write_s']:.2f} s. Each run: {a['warmup']} warm-up steps, {a['quiet']} "
            f"quiet steps (its baseline), {a['intervals']} checkpoints every k steps. Stall = steady-state time "
            "lost per checkpoint; first = time the first interval lost; drain = wait after the last step until "
            f"every checkpoint is durable; the `none` row (no checkpoint, the same arithmetic) is the noise floor. Medians of {a['runs']} rounds. Targets for fastckpt at the disk's "
            f"pace: {TARGETS}. DeepSpeed rows: ZeRO-2 with {a['ds_layers']} layers (own baseline).\n")
    if res.get("merged_from"):
        head += "Merged from the runs of " + "; ".join(res["merged_from"]) + ".\n"
    lines = ["| k | contender | step (ms) | save call (ms) | first save call (ms) | stall / ckpt (ms) | "
             "stall / copy bound | first ckpt (s) | steady | whole run | drain (s) | checked |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        if r["errors"] and "base_ms" not in r:
            lines.append(f"| {r['k']} | {r['contender']} | {r['errors'][0][:120]} |||||||||||")
            continue
        note = f" ({len(r['errors'])} of {len(r['runs'])} failed)" if r["errors"] else ""
        lines.append(f"| {r['k']} | {r['contender']}{note} | {r['base_ms']:.1f} | {r['save_ms']:.1f} | "
                     f"{r['save_first_ms']:.0f} | {r['stall_ms']:.0f} | {r['stall_ms'] / 1e3 / b['copy_s']:.2f} | "
                     f"{r['first_s']:.2f} | {r['steady_pct']:+.1f} % | {r['whole_pct']:+.1f} % | "
                     f"{r['drain_s']:.2f} | {'yes' if r['checked'] else 'NO'} |")
    lines.append(breakdown(res["rows"]))
    fresh = [r for r in res["rows"] if r.get("stager_fresh")]
    if fresh:
        lines.append(f"\nDCP DefaultStager: a fresh stager for every save (its pinned memory allocated again "
                     f"each time): {fresh[0]['stager_fresh']}.")
    return head + "\n" + "\n".join(lines)


BREAKDOWN = [("save", "save call"), ("slot", "slot"), ("plan", "plan"), ("staging", "staging"),
             ("begin", "begin"), ("start", "enqueue in save"), ("gate", "gate wait"), ("copied_at", "copied at"),
             ("enqueue", "stream enqueue"), ("stream_wait", "stream wait"), ("copy", "host copy"),
             ("chunk_wait", "chunk wait (disk)"), ("crc", "CRC"), ("put", "write"), ("finish", "finish + fsync"),
             ("order_wait", "order wait"), ("commit", "commit"), ("durable_at", "durable at"),
             ("retain", "delete old (after)")]


def breakdown(rows: list) -> str:
    """Where fastckpt's saves went, ms per save after the first (fastckpt.timings)."""
    timed = [r for r in rows if r.get("phases")]
    if not timed:
        return ""
    out = ["\nWhere a fastckpt save went, ms per save after the first (fastckpt.timings; mean per save, median of "
           "rounds). The first six columns are inside the save call; threads' sums (copy, CRC, write) may exceed "
           "the wall time; chunk wait = copies waiting for a free staging chunk (the disk is the limit); delete old = "
           "retention removing checkpoints beyond keep, after each landed: disk time the next save may share.\n",
           "| k | contender | " + " | ".join(label for _, label in BREAKDOWN) + " |",
           "|---|---|" + "---:|" * len(BREAKDOWN)]
    for r in timed:
        out.append(f"| {r['k']} | {r['contender']} | " +
                   " | ".join(f"{r['phases'][p] * 1e3:.1f}" if p in r["phases"] else "–" for p, _ in BREAKDOWN) + " |")
    return "\n".join(out)


def plot(res: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    names = list(dict.fromkeys(r["contender"] for r in res["rows"]))
    for name in names:
        pts = sorted((r["k"], r["steady_pct"], r["stall_ms"]) for r in res["rows"]
                     if r["contender"] == name and "base_ms" in r)
        style = "-" if name not in contenders.PEERS else "--"
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=name)
        axes[1].plot([p[0] for p in pts], [p[2] for p in pts], style, marker="o", label=name)
    axes[0].axhline(3, color="grey", lw=0.5, ls=":")
    axes[0].set_ylabel("steady-state training overhead (%)")
    axes[1].axhline(res["bounds"]["copy_s"] * 1e3, color="grey", lw=0.5, ls=":", label="copy bound")
    axes[1].set_ylabel("stall per checkpoint (ms)")
    for ax in axes:
        ax.set_xlabel("checkpoint every k steps")
        ax.set_xscale("log")
        ax.set_yscale("symlog")
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle(f"Checkpoint overhead, {res['device']} (medians of runs)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
