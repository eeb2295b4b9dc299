"""Fastensor's measurements on this machine: per-tool tensor I/O bandwidth, the adaptive
choice's hit rate against an oracle, and what activation offload does to memory.

    python benchmarks/offload.py [--parts bandwidth hitrate memory] [--runs 3] [--cap-mb 1024]

bandwidth  every tool (posix, direct, numpy, torch; kvikio with CUDA) writes and reads one
           tensor of each size (1 MiB - 1.5 GiB), medians of --runs; each read is cold (the
           file's pages dropped first: fdatasync + POSIX_FADV_DONTNEED). Bounds measured in
           the same run: a memcpy and multi-threaded O_DIRECT write/read of the same size.
hitrate    three learners (TensorIO aware="w", "r", "wr") handle a shuffled stream of
           transfers of activation-like sizes, each write then cold read; for every transfer
           an oracle times every tool (best of 2) and the learner hits when its choice is the
           oracle's fastest on its own measure (write, read, write+read). Counted after each
           size's learning uses (one per tool), and in all; also "within 10 %" of the fastest.
memory     benchmarks/offload_memory.py: the largest batch of a deep CPU model that trains
           under a memory cap with and without activation offload, and time per step.
Prints tables, writes JSON + PNG, and its section of benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import shutil
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))
import bounds  # noqa: E402
import offload_memory  # noqa: E402
from results import keep  # noqa: E402

import torch  # noqa: E402

from fastckpt.offload import TensorIO, available_tools  # noqa: E402
from fastckpt.offload.tools import read_tensor, write_tensor  # noqa: E402

MiB = 1 << 20


def timed_pair(t: torch.Tensor, path: str, tool: str) -> tuple[float, float]:
    """(write s, cold read s) of t with one tool."""
    if os.path.exists(path):
        os.unlink(path)
    t0 = time.perf_counter()
    write_tensor(t, path, tool)
    w = time.perf_counter() - t0
    bounds.drop_cache(path)
    t0 = time.perf_counter()
    read_tensor(path)
    r = time.perf_counter() - t0
    os.unlink(path)
    return w, r


def usable_tools(work: str) -> tuple[list[str], dict]:
    found = available_tools(work, cuda=torch.cuda.is_available())
    return [t for t, why in found.items() if why is None], {t: why for t, why in found.items() if why}


# -- bandwidth ------------------------------------------------------------------
def bandwidth(work: str, sizes_mb: list[float], runs: int) -> dict:
    tools, missing = usable_tools(work)
    rows = []
    for mb in sizes_mb:
        t = torch.randn(int(mb * MiB) // 4)
        times = {tool: {"w": [], "r": []} for tool in tools}
        for _ in range(runs):
            for tool in random.sample(tools, len(tools)):
                w, r = timed_pair(t, os.path.join(work, "bw.fct"), tool)
                times[tool]["w"].append(w)
                times[tool]["r"].append(r)
        scratch = os.path.join(work, "bound.bin")
        bound = {"memcpy_s": bounds.memcpy_seconds({"t": t}),
                 "direct_write_s": bounds.direct_write_seconds(scratch, t.numel() * 4)}
        bounds.drop_cache(scratch)
        bound["direct_read_s"] = bounds.direct_read_seconds(scratch, t.numel() * 4)
        os.unlink(scratch)
        rows.append({"mb": mb, "bytes": t.numel() * 4, "bound": bound,
                     "median": {k: {d: statistics.median(v[d]) for d in "wr"} for k, v in times.items()}})
        print(bandwidth_row(rows[-1]), flush=True)
    return {"tools": tools, "unavailable": missing, "rows": rows}


def bandwidth_row(row: dict) -> str:
    gb = row["bytes"] / 1e9
    cells = "  ".join(f"{k} {gb / m['w']:5.2f}/{gb / m['r']:5.2f}" for k, m in row["median"].items())
    b = row["bound"]
    return (f"{row['mb']:>7.0f} MiB  {cells}   bound: memcpy {gb / b['memcpy_s']:5.2f}, "
            f"O_DIRECT {gb / b['direct_write_s']:5.2f}/{gb / b['direct_read_s']:5.2f}  (GB/s write/read)")


def bandwidth_table(res: dict) -> str:
    tools = res["tools"]
    lines = ["| size | " + " | ".join(f"{t} write / read GB/s" for t in tools)
             + " | bound: O_DIRECT write / read GB/s | memcpy GB/s | fastest write / read |",
             "|---" * (len(tools) + 4) + "|"]
    for row in res["rows"]:
        gb, m, b = row["bytes"] / 1e9, row["median"], row["bound"]
        fw = min(m, key=lambda k: m[k]["w"])
        fr = min(m, key=lambda k: m[k]["r"])
        lines.append(f"| {row['mb']:.0f} MiB | " + " | ".join(f"{gb / m[t]['w']:.2f} / {gb / m[t]['r']:.2f}"
                                                             for t in tools)
                     + f" | {gb / b['direct_write_s']:.2f} / {gb / b['direct_read_s']:.2f} | "
                       f"{gb / b['memcpy_s']:.2f} | {fw} / {fr} |")
    if res["unavailable"]:
        lines.append("\nNot usable here: " + "; ".join(f"{t}: {why}" for t, why in res["unavailable"].items()))
    return "\n".join(lines)


# -- hit rate -------------------------------------------------------------------
MEASURES = {"w": lambda w, r: w, "r": lambda w, r: r, "wr": lambda w, r: w + r}


def hitrate(work: str, sizes_mb: list[float], per_size: int, seed: int) -> dict:
    tools, _ = usable_tools(work)
    rng = random.Random(seed)
    stream = [mb for mb in sizes_mb for _ in range(per_size)]
    rng.shuffle(stream)
    learners = {m: TensorIO(mode="aware", aware=m, tools=tuple(tools)) for m in MEASURES}
    tensors = {mb: torch.randn(int(mb * MiB) // 4) for mb in sizes_mb}
    seen: dict[float, int] = {}
    log = []
    for mb in stream:
        t = tensors[mb]
        seen[mb] = seen.get(mb, 0) + 1
        oracle = {}
        for tool in rng.sample(tools, len(tools)):
            pairs = [timed_pair(t, os.path.join(work, "oracle.fct"), tool) for _ in range(2)]
            oracle[tool] = (min(p[0] for p in pairs), min(p[1] for p in pairs))
        entry = {"mb": mb, "nth": seen[mb], "oracle": oracle, "chosen": {}}
        for m, io in learners.items():
            path = os.path.join(work, f"learner-{m}.fct")
            entry["chosen"][m] = io.save(t, path)
            bounds.drop_cache(path)
            io.load(path)
            os.unlink(path)
        log.append(entry)
    return {"tools": tools, "per_size": per_size, "sizes_mb": sizes_mb, "log": log, **score(log, len(tools))}


def score(log: list[dict], learning: int) -> dict:
    out = {}
    for m, f in MEASURES.items():
        counts = {"all": [0, 0], "learned": [0, 0], "within10": [0, 0]}
        for e in log:
            cost = {tool: f(*wr) for tool, wr in e["oracle"].items()}
            best = min(cost, key=cost.get)
            hit = e["chosen"][m] == best
            near = cost[e["chosen"][m]] <= 1.10 * cost[best]
            counts["all"][0] += hit
            counts["all"][1] += 1
            if e["nth"] > learning:
                counts["learned"][0] += hit
                counts["learned"][1] += 1
                counts["within10"][0] += near
                counts["within10"][1] += 1
        out[m] = {k: (h / n if n else float("nan"), n) for k, (h, n) in counts.items()}
    return {"scores": out}


def hitrate_table(res: dict) -> str:
    lines = ["| learner (decides by) | hit rate after learning | within 10 % of the fastest | hit rate, all transfers |",
             "|---|---|---|---|"]
    names = {"w": "WDic (write time)", "r": "RDic (read time)", "wr": "WRDic (write + read)"}
    for m, s in res["scores"].items():
        lines.append(f"| {names[m]} | **{s['learned'][0]:.0%}** (n={s['learned'][1]}) | {s['within10'][0]:.0%} | "
                     f"{s['all'][0]:.0%} (n={s['all'][1]}) |")
    return "\n".join(lines)


# -- memory ---------------------------------------------------------------------
def memory_table(res: dict) -> str:
    off, on, same = res.get("at_max_off"), res.get("at_max_on"), res.get("on_at_max_off")
    if not off or not on:
        return "memory: a search found no fitting batch"

    def row(name, r):
        return (f"| {name} | {r['batch']} | {r['peak_rss_mb']:.0f} MiB | {r['cap_peak_mb'] or float('nan'):.0f} MiB | "
                f"{r['step_s']:.2f} s | {r['batch'] / r['step_s']:.0f} |")

    ratio = res["max_batch_on"] / res["max_batch_off"]
    lines = [f"Cap {res['cap_mb']} MiB ({off['cap_kind']}); model: {res['depth']} blocks of Linear({res['width']}) -> "
             f"GELU -> LayerNorm, SGD, {res['activation_bytes_per_sample'] / 1024:.0f} KiB of saved activations per "
             f"sample; offload: threshold {res['threshold_mb']} MiB, at most {res['inflight_mb']:.0f} MiB being "
             f"written, aware=wr.\n",
             "| run | batch | peak RSS | cap's peak (page cache included) | time per step | samples/s |",
             "|---|---|---|---|---|---|",
             row("largest batch without offload", off), row("largest batch with offload", on)]
    if same:
        lines.append(row("offload at the no-offload batch", same))
    lines.append(f"\n**Largest batch under the cap: {res['max_batch_on']} with offload vs {res['max_batch_off']} "
                 f"without = {ratio:.2f}x.** Slowdown: samples/s {off['batch'] / off['step_s']:.0f} -> "
                 f"{on['batch'] / on['step_s']:.0f} at the largest batches"
                 + (f"; at the same batch ({off['batch']}) a step takes {same['step_s'] / off['step_s']:.2f}x as long"
                    if same else "") + ".")
    return "\n".join(lines)


def plot(res: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    bw = res.get("bandwidth")
    if bw:
        for ax, d, name in ((axes[0], "w", "write"), (axes[1], "r", "cold read")):
            mbs = [r["mb"] for r in bw["rows"]]
            for tool in bw["tools"]:
                ax.plot(mbs, [r["bytes"] / 1e9 / r["median"][tool][d] for r in bw["rows"]], marker="o", label=tool)
            key = "direct_write_s" if d == "w" else "direct_read_s"
            ax.plot(mbs, [r["bytes"] / 1e9 / r["bound"][key] for r in bw["rows"]], "k--", label="O_DIRECT bound")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("tensor size (MiB)")
            ax.set_ylabel("GB/s")
            ax.set_title(f"tensor {name} bandwidth per tool")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", nargs="+", default=["bandwidth", "hitrate", "memory"],
                    choices=["bandwidth", "hitrate", "memory"])
    ap.add_argument("--sizes", type=float, nargs="+", default=[1, 4, 16, 64, 256, 1024, 1536], help="MiB")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hit-sizes", type=float, nargs="+", default=[0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256])
    ap.add_argument("--per-size", type=int, default=10)
    ap.add_argument("--cap-mb", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=24)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--start-batch", type=int, default=1024)
    ap.add_argument("--inflight-mb", type=float, default=64)
    ap.add_argument("--threshold-mb", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--no-results", action="store_true", help="do not rewrite RESULTS.md")
    args = ap.parse_args()
    work = os.path.join(args.out, "offload_bench")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    random.seed(args.seed)
    res: dict = {"args": vars(args)}
    texts = []
    try:
        if "bandwidth" in args.parts:
            print("== per-tool bandwidth ==", flush=True)
            res["bandwidth"] = bandwidth(work, args.sizes, args.runs)
            texts.append("### Per-tool bandwidth (medians of %d; reads cold)\n\n" % args.runs
                         + bandwidth_table(res["bandwidth"]))
            print(texts[-1], flush=True)
        if "hitrate" in args.parts:
            print("== adaptive hit rate against the oracle ==", flush=True)
            res["hitrate"] = hitrate(work, args.hit_sizes, args.per_size, args.seed)
            texts.append(f"### Adaptive choice vs an oracle timing every tool ({len(args.hit_sizes)} sizes "
                         f"{args.hit_sizes[0]}-{args.hit_sizes[-1]} MiB x {args.per_size}, shuffled)\n\n"
                         + hitrate_table(res["hitrate"]))
            print(texts[-1], flush=True)
        if "memory" in args.parts:
            print("== memory under a cap ==", flush=True)
            res["memory"] = offload_memory.run(args.cap_mb, work, args.depth, args.width, 3, args.start_batch, 0.06,
                                               args.inflight_mb, args.threshold_mb)
            texts.append("### Largest trainable batch under a memory cap\n\n" + memory_table(res["memory"]))
            print(texts[-1], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    res["when"] = stamp
    head = (f"## offload.py — {stamp}, {platform.node()} ({os.cpu_count()} cores, CPU only), "
            f"`python benchmarks/offload.py {' '.join(sys.argv[1:])}`\n")
    keep("offload", args.out, res, head + "\n" + "\n\n".join(texts), plot, publish=not args.no_results)


if __name__ == "__main__":
    main()
