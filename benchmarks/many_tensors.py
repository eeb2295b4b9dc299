"""A state of many tensors: what a save costs after its last data byte, by the number of tensors.

    python benchmarks/many_tensors.py --gib 0.5 --counts 16 300 1000 --runs 3

The same bytes (GIB of float32) split into COUNT tensors (a model of COUNT parameters and optimizer
states: an LLM's state dict holds hundreds to thousands). Every record of the torch archive has a
header beside it, written once the record's CRC is known, after the data: where that header shares a
4 KiB page with bytes already on the disk, the page must be read back before it is written, a cost
per tensor paid after the last data byte. For each COUNT:
  fastckpt `c`           a long-lived Checkpointer (keep=1, one warm-up save): until durable, the last
                         data byte (`written`, Pending.timings) and the phase after it
                         (`finish + fdatasync`: the headers and the file's fdatasync)
  torch.save + fsync     the same state, one file, fsync'ed
  O_DIRECT write (bound) the same number of bytes, fdatasync (helpers.bounds: best of 1 and 4 threads)
Medians of RUNS runs, each of every contender in turn. Rewrites its section of benchmarks/RESULTS.md
(--no-results: not).
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def fastckpt_save(ck, state: dict, step: int) -> dict:
    p = ck.save(state, step=step)
    ck.gate()
    p.wait()
    t = p.timings
    return {"durable": t["durable_at"], "written": t["written_at"], "finish": t.get("finish", 0.0)}


def one_count(count: int, nbytes: int, work: str, runs: int) -> dict:
    from fastckpt import Checkpointer
    from helpers import bounds, peers
    torch.manual_seed(count)
    numel = nbytes // 4 // count
    state = {f"layer{i}.weight": torch.randn(numel) for i in range(count)}
    total = numel * 4 * count
    rows: dict[str, list[float]] = {}
    root = os.path.join(work, f"ck{count}")
    shutil.rmtree(root, ignore_errors=True)
    ck = Checkpointer(root, strategy="c", keep=1)
    try:
        fastckpt_save(ck, state, 0)  # warm-up: staging grown, threads started
        for run in range(runs):
            got = fastckpt_save(ck, state, run + 1)
            for k, v in got.items():
                rows.setdefault(f"fastckpt_{k}", []).append(v)
            path = os.path.join(work, "torch.pt")
            rows.setdefault("torch_save", []).append(peers.torch_save(state, path))
            os.unlink(path)
            rows.setdefault("odirect_write", []).append(
                bounds.direct_write_seconds(os.path.join(work, "raw.bin"), total))
            os.unlink(os.path.join(work, "raw.bin"))
    finally:
        ck.close()
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    return {"count": count, "bytes": total, "median_s": med, "all_s": rows}


def table(res: dict) -> str:
    lines = [f"## many_tensors.py — {res['when']}, {platform.node()} ({os.cpu_count()} cores, torch {torch.__version__}, "
             f"CPU only), `python benchmarks/many_tensors.py --gib {res['gib']} --counts "
             f"{' '.join(str(r['count']) for r in res['counts'])} --runs {res['runs']}`",
             "",
             f"{res['gib']} GiB of float32 in each number of tensors, medians of {res['runs']} runs; `after it`: from the "
             "last data byte to the end of the file's finish (its headers written, then fdatasync), summed phase "
             "`finish` of Pending.timings.",
             "",
             "| tensors | fastckpt `c` until durable (s) | last data byte (s) | after it: headers + fdatasync (ms) "
             "| torch.save + fsync (s) | O_DIRECT write (bound, s) | ratios |",
             "|---:|---:|---:|---:|---:|---:|---|"]
    for r in res["counts"]:
        m = r["median_s"]
        lines.append(f"| {r['count']} | {m['fastckpt_durable']:.3f} | {m['fastckpt_written']:.3f} | "
                     f"{1e3 * m['fastckpt_finish']:.1f} | {m['torch_save']:.3f} | {m['odirect_write']:.3f} | "
                     f"{m['odirect_write'] / m['fastckpt_durable']:.2f}x the bound; "
                     f"{m['torch_save'] / m['fastckpt_durable']:.2f}x sooner than torch.save+fsync |")
    return "\n".join(lines)


def plot(res: dict, path: str) -> None:
    from helpers.figure import panels
    measures = []
    for r in res["counts"]:
        m = r["median_s"]
        measures.append((f"{r['count']} tensors: until durable", [
            ("O_DIRECT write (bound)", m["odirect_write"]), ("fastckpt c", m["fastckpt_durable"]),
            ("torch.save + fsync", m["torch_save"])]))
    panels(path, f"{res['gib']} GiB in many tensors", measures)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gib", type=float, default=0.5)
    p.add_argument("--counts", type=int, nargs="+", default=[16, 300, 1000])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dir", default=os.path.join(HERE, "out", "many_tensors_work"))
    p.add_argument("--out", default=os.path.join(HERE, "out"))
    p.add_argument("--no-results", action="store_true")
    a = p.parse_args()
    sys.path.insert(0, HERE)
    from helpers.results import keep
    os.makedirs(a.dir, exist_ok=True)
    try:
        counts = [one_count(c, int(a.gib * (1 << 30)), a.dir, a.runs) for c in a.counts]
    finally:
        shutil.rmtree(a.dir, ignore_errors=True)
    res = {"when": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "gib": a.gib, "runs": a.runs, "counts": counts}
    text = table(res)
    print(text)
    keep("many_tensors", a.out, res, text, plot, publish=not a.no_results)


if __name__ == "__main__":
    main()
