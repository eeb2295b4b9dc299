"""Fastensor's measurements on this machine: per-tool tensor I/O bandwidth, the adaptive
choice's hit rate against an oracle, and what activation offload does to memory.

    python benchmarks/offload.py [--parts bandwidth hitrate memory written] [--runs 3] [--cap-mb 1024]
                                 [--written-batch 1024] [--before TREE]

bandwidth  every tool (posix, direct, numpy, torch; kvikio with CUDA) writes and reads one
           tensor of each size (1 MiB - 1.5 GiB), medians of --runs; each read is cold (the
           file's pages dropped first: fdatasync + POSIX_FADV_DONTNEED). Bounds measured in
           the same run: a memcpy and multi-threaded O_DIRECT write/read of the same size.
hitrate    three learners (TensorIO aware="w", "r", "wr") handle a shuffled stream of
           transfers of activation-like sizes, each write then cold read; for every transfer
           an oracle times every tool twice. A learner hits when its choice is the fastest on
           its own measure (write, read, write+read): for the size (each tool's median over all
           its timings of that size), and for the transfer (best of its 2); also "within 10 %",
           and the ceiling the oracle's noise allows (its two rounds agreeing). Scored after
           each size's learning uses (explore x tools), and in all.
memory     benchmarks/helpers/offload_memory.py: the largest batch of a deep CPU model that trains
           under a memory cap with and without activation offload, and time per step.
written    the same model at one batch (--written-batch), uncapped: the bytes offload writes per
           step, how many saved tensors it wrote and kept, and the step time — for this tree and,
           with --before TREE, for another checkout of fastckpt (its extension built) in the
           same run: what a change to what offload writes did.
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
from helpers import bounds  # noqa: E402
from helpers import offload_memory  # noqa: E402
from helpers.results import keep  # noqa: E402

import torch  # noqa: E402

from fastckpt.offload import TensorIO, available_tools  # noqa: E402
from fastckpt.offload.io_tools import read_tensor, write_tensor  # noqa: E402

MiB = 1 << 20
PARTS = ("bandwidth", "hitrate", "memory", "written")


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


def hitrate(work: str, sizes_mb: list[float], per_size: int, seed: int, explore: int) -> dict:
    tools, _ = usable_tools(work)
    rng = random.Random(seed)
    stream = [mb for mb in sizes_mb for _ in range(per_size)]
    rng.shuffle(stream)
    learners = {m: TensorIO(mode="aware", aware=m, tools=tuple(tools), explore=explore) for m in MEASURES}
    tensors = {mb: torch.randn(int(mb * MiB) // 4) for mb in sizes_mb}
    seen: dict[float, int] = {}
    log = []
    for mb in stream:
        t = tensors[mb]
        seen[mb] = seen.get(mb, 0) + 1
        rounds: dict[str, list] = {tool: [] for tool in tools}
        for _ in range(2):  # two rounds, each timing every tool in a fresh random order
            for tool in rng.sample(tools, len(tools)):
                rounds[tool].append(timed_pair(t, os.path.join(work, "oracle.fct"), tool))
        entry = {"mb": mb, "nth": seen[mb], "rounds": rounds, "chosen": {}}
        for m, io in learners.items():
            path = os.path.join(work, f"learner-{m}.fct")
            entry["chosen"][m] = io.save(t, path)
            bounds.drop_cache(path)
            io.load(path)
            os.unlink(path)
        log.append(entry)
    return {"tools": tools, "per_size": per_size, "explore": explore, "sizes_mb": sizes_mb, "log": log,
            **score(log, explore * len(tools))}


def score(log: list[dict], learning: int) -> dict:
    """Hit rates against two oracles: per transfer (each tool's best of its two timings of that
    transfer) and per size (each tool's median over every timing of that size: which tool is
    the fastest for the size). `ceiling`: how often the two rounds of one transfer agree on the
    fastest tool, i.e. what repeating the same measurement scores against the per-transfer oracle."""
    by_size: dict[float, dict[str, list]] = {}
    for e in log:
        for tool, pairs in e["rounds"].items():
            by_size.setdefault(e["mb"], {}).setdefault(tool, []).extend(pairs)
    out = {}
    for m, f in MEASURES.items():
        size_cost = {mb: {t: statistics.median(f(*p) for p in d[t]) for t in d} for mb, d in by_size.items()}
        size_best = {mb: min(c, key=c.get) for mb, c in size_cost.items()}
        c = {k: [0, 0] for k in ("transfer", "size", "size5", "within10", "ceiling", "all")}
        for e in log:
            cost = {tool: min(f(*p) for p in pairs) for tool, pairs in e["rounds"].items()}
            best, chosen = min(cost, key=cost.get), e["chosen"][m]
            c["all"][0] += chosen == best
            c["all"][1] += 1
            if e["nth"] <= learning:
                continue
            first = {tool: f(*pairs[0]) for tool, pairs in e["rounds"].items()}
            second = {tool: f(*pairs[1]) for tool, pairs in e["rounds"].items()}
            sc = size_cost[e["mb"]]
            for k, hit in (("transfer", chosen == best), ("size", chosen == size_best[e["mb"]]),
                           ("size5", sc[chosen] <= 1.05 * sc[size_best[e["mb"]]]),
                           ("within10", cost[chosen] <= 1.10 * cost[best]),
                           ("ceiling", min(first, key=first.get) == min(second, key=second.get))):
                c[k][0] += hit
                c[k][1] += 1
        out[m] = {k: (h / n if n else float("nan"), n) for k, (h, n) in c.items()}
        out[m]["size_cost"] = {str(mb): c for mb, c in size_cost.items()}
    return {"scores": out}


def hitrate_table(res: dict) -> str:
    lines = ["| learner (decides by) | hit rate vs the per-size oracle | same, a tool within 5 % of the size's "
             "fastest counts | hit rate vs the per-transfer oracle | within 10 % of the transfer's fastest | "
             "per-transfer ceiling (oracle vs itself) | all transfers, learning included (per-transfer) |",
             "|---|---|---|---|---|---|---|"]
    names = {"w": "WDic (write time)", "r": "RDic (read time)", "wr": "WRDic (write + read)"}
    for m, s in res["scores"].items():
        lines.append(f"| {names[m]} | **{s['size'][0]:.0%}** (n={s['size'][1]}) | {s['size5'][0]:.0%} | "
                     f"{s['transfer'][0]:.0%} | "
                     f"{s['within10'][0]:.0%} | {s['ceiling'][0]:.0%} | {s['all'][0]:.0%} (n={s['all'][1]}) |")
    costs = res["scores"]["wr"]["size_cost"]
    lines.append("\nPer-size oracle by write + read (median ms per tool, fastest first): " + "; ".join(
        f"{mb} MiB " + ", ".join(f"{t} {v * 1e3:.1f}" for t, v in sorted(c.items(), key=lambda x: x[1]))
        for mb, c in sorted(costs.items(), key=lambda x: float(x[0]))))
    return "\n".join(lines)


# -- memory ---------------------------------------------------------------------
def memory_table(res: dict) -> str:
    off, on, same = res.get("at_max_off"), res.get("at_max_on"), res.get("on_at_max_off")
    if not off or not on:
        return "memory: a search found no fitting batch"

    def row(name, r):
        written = (f"{r['offloaded']['bytes'] / r['steps'] / MiB:.0f} MiB" if r.get("offloaded") and r.get("steps")
                   else "-")
        return (f"| {name} | {r['batch']} | {r['peak_rss_mb']:.0f} MiB | {r['cap_peak_mb'] or float('nan'):.0f} MiB | "
                f"{r['step_s']:.2f} s | {r['batch'] / r['step_s']:.0f} | {written} |")

    ratio = res["max_batch_on"] / res["max_batch_off"]
    lines = [f"Cap {res['cap_mb']} MiB ({off['cap_kind']}); model: {res['depth']} blocks of Linear({res['width']}) -> "
             f"GELU -> LayerNorm, SGD, {res['activation_bytes_per_sample'] / 1024:.0f} KiB of saved activations per "
             f"sample; offload: threshold {res['threshold_mb']} MiB, at most {res['inflight_mb']:.0f} MiB being "
             f"written, aware=wr.\n",
             "| run | batch | peak RSS | cap's peak (page cache included) | time per step | samples/s | "
             "offload wrote per step |",
             "|---|---|---|---|---|---|---|",
             row("largest batch without offload", off), row("largest batch with offload", on)]
    if same:
        lines.append(row("offload at the no-offload batch", same))
    lines.append(f"\n**Largest batch under the cap: {res['max_batch_on']} with offload vs {res['max_batch_off']} "
                 f"without = {ratio:.2f}x.** Slowdown: samples/s {off['batch'] / off['step_s']:.0f} -> "
                 f"{on['batch'] / on['step_s']:.0f} at the largest batches"
                 + (f"; at the same batch ({off['batch']}) a step takes {same['step_s'] / off['step_s']:.2f}x as long"
                    if same else "") + ".")
    return "\n".join(lines)


# -- written --------------------------------------------------------------------
def written(work: str, batch: int, depth: int, width: int, steps: int, inflight_mb: float, threshold_mb: float,
            before: str | None) -> dict:
    """What offload writes per step at one batch, for this tree and (before) another checkout."""
    import json
    import subprocess
    trees = {"this tree": os.path.dirname(HERE)}
    if before:
        trees[f"--before {before}"] = os.path.abspath(before)
    rows = {}
    for name, tree in trees.items():
        cmd = [sys.executable, offload_memory.CHILD, "--batch", str(batch), "--offload", "on", "--dir", work,
               "--depth", str(depth), "--width", str(width), "--steps", str(steps), "--inflight-mb",
               str(inflight_mb), "--threshold-mb", str(threshold_mb)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=tree), check=True)
        r = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
        head = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        rows[name] = dict(r, commit=head.stdout.strip() or "?")
        print(f"  {name}: {r['offloaded']['bytes'] / steps / MiB:.1f} MiB written per step", flush=True)
    return {"batch": batch, "depth": depth, "width": width, "steps": steps, "threshold_mb": threshold_mb,
            "rows": rows}


def written_table(res: dict) -> str:
    lines = [f"Model as above ({res['depth']} blocks of Linear({res['width']})), batch {res['batch']}, "
             f"{res['steps']} steps, uncapped; offload threshold {res['threshold_mb']} MiB. Per step:\n",
             "| fastckpt | written | saved tensors written | shared (written once) | kept: below threshold, "
             "or alive elsewhere | of which alive elsewhere | median step |",
             "|---|---|---|---|---|---|---|"]
    for name, r in res["rows"].items():
        st, n = r["offloaded"], res["steps"]
        alive = f"{st['kept_alive_elsewhere'] / n:.0f}" if "kept_alive_elsewhere" in st else "(not counted)"
        lines.append(f"| {name} ({r['commit']}) | {st['bytes'] / n / MiB:.1f} MiB | {st['offloaded'] / n:.0f} | "
                     f"{st['shared'] / n:.0f} | {st['kept'] / n:.0f} | {alive} | {r['step_s']:.2f} s |")
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
    ap.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS))
    ap.add_argument("--sizes", type=float, nargs="+", default=[1, 4, 16, 64, 256, 1024, 1536], help="MiB")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hit-sizes", type=float, nargs="+", default=[0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256])
    ap.add_argument("--per-size", type=int, default=16)
    ap.add_argument("--explore", type=int, default=2, help="TensorIO(explore=): timed uses per tool before deciding")
    ap.add_argument("--cap-mb", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=24)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--start-batch", type=int, default=1024)
    ap.add_argument("--inflight-mb", type=float, default=64)
    ap.add_argument("--threshold-mb", type=float, default=1.0)
    ap.add_argument("--written-batch", type=int, default=1024)
    ap.add_argument("--before", default=None, help="another checkout of fastckpt (built) for the written part")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--no-results", action="store_true", help="do not rewrite RESULTS.md")
    ap.add_argument("--rescore", action="store_true",
                    help="measure nothing: recompute the published hit-rate scores from its saved log")
    args = ap.parse_args()
    if args.rescore:
        res = previous_parts(args.out)
        if "hitrate" not in res:
            ap.error(f"--rescore needs the hit-rate log of an earlier run in {args.out}/offload.json (run the "
                     "hitrate part first)")
        h = res["hitrate"]
        h.update(score(h["log"], h["explore"] * len(h["tools"])))
        keep("offload", args.out, res, results_text(res), plot, publish=True)
        print(section("hitrate", h))
        return
    work = os.path.join(args.out, "offload_bench")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    random.seed(args.seed)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    command = f"python benchmarks/offload.py {' '.join(sys.argv[1:])}".strip()
    res: dict = previous_parts(args.out) if not args.no_results else {}
    missing = [p for p in PARTS if p not in args.parts and p not in res]
    if missing and not args.no_results:  # RESULTS.md's section would lose the tables of those parts
        ap.error(f"the parts {missing} were never measured into {args.out}/offload.json: run them too, "
                 "or pass --no-results")
    try:
        for part in args.parts:
            print(f"== {part} ==", flush=True)
            if part == "bandwidth":
                data = bandwidth(work, args.sizes, args.runs)
            elif part == "hitrate":
                data = hitrate(work, args.hit_sizes, args.per_size, args.seed, args.explore)
            elif part == "memory":
                data = offload_memory.run(args.cap_mb, work, args.depth, args.width, 3, args.start_batch, 0.06,
                                          args.inflight_mb, args.threshold_mb)
            else:
                data = written(work, args.written_batch, args.depth, args.width, 3, args.inflight_mb,
                               args.threshold_mb, args.before)
            res[part] = dict(data, when=stamp, command=command, args=vars(args))
            print(section(part, res[part]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    keep("offload", args.out, res, results_text(res), plot, publish=not args.no_results)


def results_text(res: dict) -> str:
    head = f"## offload.py — {platform.node()} ({os.cpu_count()} cores, CPU only); each part names the run it comes from\n"
    return head + "\n" + "\n\n".join(section(p, res[p]) for p in PARTS if p in res)




def previous_parts(out_dir: str) -> dict:
    """The parts an earlier run recorded (OUT/offload.json), which a run that measures only some keeps."""
    import json
    path = os.path.join(out_dir, "offload.json")
    if not os.path.exists(path):
        return {}
    old = json.load(open(path))
    return {p: old[p] for p in PARTS if p in old and "when" in old[p]}


def section(part: str, data: dict) -> str:
    a = data["args"]
    origin = f"\n\n_{data['when']}, `{data['command']}`_"
    if part == "bandwidth":
        return f"### Per-tool bandwidth (medians of {a['runs']}; reads cold){origin}\n\n" + bandwidth_table(data)
    if part == "hitrate":
        return (f"### Adaptive choice vs an oracle timing every tool ({len(data['sizes_mb'])} sizes "
                f"{data['sizes_mb'][0]}-{data['sizes_mb'][-1]} MiB x {data['per_size']}, shuffled; explore="
                f"{data['explore']}: scored after each size's first {data['explore']} x {len(data['tools'])} "
                f"learning uses){origin}\n\n" + hitrate_table(data))
    if part == "memory":
        return f"### Largest trainable batch under a memory cap{origin}\n\n" + memory_table(data)
    return f"### What offload writes per step{origin}\n\n" + written_table(data)


if __name__ == "__main__":
    main()
