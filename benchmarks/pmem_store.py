"""Checkpointing into a pool on /dev/shm (the pmem store) vs the file store on disk vs
torch.save, the same state, with the memcpy bound measured in the same run.

    python benchmarks/pmem_store.py --sizes 0.25 1 --runs 5

Contenders, each on a long-lived Checkpointer (as in training) and warmed up once:
  pool msync   store="pmem" on /dev/shm, persisted by msync (what ordinary memory gets)
  pool fence   the same pool with persist="fence": non-temporal stores + cache-line
               write-back + store fence, the path real PMEM (MAP_SYNC / device-dax) takes
  file store   the root store (store="root") on the benchmark's disk directory (strategy c, O_DIRECT)
  torch.save   + fsync, on disk and on /dev/shm
For each: the time the caller is blocked (save + gate: until the tensors may change) and
the time until durable and committed; loads are verified (every CRC). Medians of --runs.
Prints a table, writes JSON + PNG, and its section of benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import sys
import time


HERE = os.path.dirname(os.path.abspath(__file__))
from helpers import bounds  # noqa: E402
from helpers import peers  # noqa: E402
from helpers.results import keep  # noqa: E402
from save_load import make_state  # noqa: E402

import fastckpt  # noqa: E402

SHM = "/dev/shm"


def timed_save(ck: fastckpt.Checkpointer, state, step: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    p = ck.save(state, step=step)
    ck.gate()
    blocking = time.perf_counter() - t0
    p.wait()
    return blocking, time.perf_counter() - t0


def timed_load(ck: fastckpt.Checkpointer) -> float:
    t0 = time.perf_counter()
    ck.load(mmap=False)
    return time.perf_counter() - t0


def one_size(gib: float, runs: int, disk_dir: str, shm_dir: str) -> dict:
    state = make_state(gib)
    nbytes = sum(v.numel() * v.element_size() for v in state.values())
    pool_mb = int(2.5 * nbytes) // (1 << 20) + 64
    cks = {
        "pool_msync": fastckpt.Checkpointer(os.path.join(shm_dir, "msync.pool"), store="pmem", persist="msync",
                                            pool_mb=pool_mb, concurrency=1),
        "pool_fence": fastckpt.Checkpointer(os.path.join(shm_dir, "fence.pool"), store="pmem", persist="fence",
                                            pool_mb=pool_mb, concurrency=1),
        "file_store": fastckpt.Checkpointer(os.path.join(disk_dir, "file_store"), concurrency=1, keep=1),
    }
    rows: dict[str, list[float]] = {}
    for r in range(runs + 1):  # round 0 warms every contender up and is discarded
        def rec(k, v):
            if r:
                rows.setdefault(k, []).append(v)
        rec("memcpy", bounds.memcpy_seconds(state))
        for name, ck in cks.items():
            blocking, durable = timed_save(ck, state, r + 1)
            rec(f"{name}_blocking", blocking)
            rec(f"{name}_durable", durable)
            rec(f"{name}_load", timed_load(ck))
        for where, d in (("disk", disk_dir), ("shm", shm_dir)):
            path = os.path.join(d, "torch.pt")
            rec(f"torch_save_{where}", peers.torch_save(state, path))
            rec(f"torch_load_{where}", peers.torch_load(path))
            os.unlink(path)
        print(f"  round {r}/{runs} of {gib} GiB done{' (warm-up)' if r == 0 else ''}", flush=True)
    persist = cks["pool_fence"].store.pool.persist_name
    for ck in cks.values():
        ck.close()
    return {"gib": gib, "bytes": nbytes, "runs": runs, "fence": persist,
            "median_s": {k: statistics.median(v) for k, v in rows.items()}, "all_s": rows}


def table(res: dict) -> str:
    m, gb = res["median_s"], res["bytes"] / 1e9
    lines = [f"### {res['bytes'] / 2**30:.2f} GiB state (16 MiB tensors), median of {res['runs']} runs", "",
             "| measure | seconds | GB/s | ratio |", "|---|---:|---:|---|"]

    def row(name, k, ratio=""):
        lines.append(f"| {name} | {m[k]:.3f} | {gb / m[k]:.2f} | {ratio} |")

    row("memcpy (bound)", "memcpy")
    for key, name in (("pool_msync", "pool on /dev/shm, msync"),
                      ("pool_fence", f"pool on /dev/shm, {res['fence']}")):
        row(f"{name}: blocking (save + gate)", f"{key}_blocking", f"{m[f'{key}_blocking'] / m['memcpy']:.2f}x memcpy")
        row(f"{name}: until committed", f"{key}_durable",
            f"{m['torch_save_disk'] / m[f'{key}_durable']:.1f}x faster than torch.save on disk; "
            f"{m['torch_save_shm'] / m[f'{key}_durable']:.1f}x torch.save on /dev/shm; "
            f"{m['file_store_durable'] / m[f'{key}_durable']:.1f}x the file store")
        row(f"{name}: load (verified)", f"{key}_load",
            f"{m['torch_load_shm'] / m[f'{key}_load']:.2f}x torch.load from /dev/shm")
    row("file store on disk: blocking (save + gate)", "file_store_blocking",
        f"{m['file_store_blocking'] / m['memcpy']:.2f}x memcpy")
    row("file store on disk: until committed", "file_store_durable",
        f"{m['torch_save_disk'] / m['file_store_durable']:.1f}x faster than torch.save on disk")
    row("file store on disk: load (verified)", "file_store_load")
    row("torch.save + fsync, disk", "torch_save_disk")
    row("torch.save + fsync, /dev/shm", "torch_save_shm")
    row("torch.load, disk (warm)", "torch_load_disk")
    row("torch.load, /dev/shm", "torch_load_shm")
    return "\n".join(lines)


def plot(res: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    keys = [("pool_msync_durable", "pool msync"), ("pool_fence_durable", "pool fence"),
            ("file_store_durable", "file store (disk)"), ("torch_save_disk", "torch.save (disk)"),
            ("torch_save_shm", "torch.save (/dev/shm)"), ("memcpy", "memcpy")]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(res["results"])
    for j, r in enumerate(res["results"]):
        ax.bar([i + j * width for i in range(len(keys))], [r["bytes"] / 1e9 / r["median_s"][k] for k, _ in keys],
               width, label=f"{r['bytes'] / 2**30:.2f} GiB")
    ax.set_xticks([i + width * (len(res["results"]) - 1) / 2 for i in range(len(keys))])
    ax.set_xticklabels([n for _, n in keys], rotation=20, ha="right")
    ax.set_ylabel("GB/s until durable (memcpy: copy only)")
    ax.set_title("checkpoint into a pool vs file store vs torch.save")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[0.25, 1.0], help="GiB")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--no-results", action="store_true", help="do not rewrite RESULTS.md")
    args = ap.parse_args()
    if not os.path.isdir(SHM):
        sys.exit(f"{SHM} is missing: the pool benchmark needs a memory-backed filesystem")
    disk_dir = os.path.join(args.out, "pmem_bench")
    shm_dir = os.path.join(SHM, f"fastckpt-bench-{os.getpid()}")
    results = []
    try:
        for gib in args.sizes:
            for d in (disk_dir, shm_dir):
                shutil.rmtree(d, ignore_errors=True)
                os.makedirs(d)
            print(f"== {gib} GiB ==", flush=True)
            results.append(one_size(gib, args.runs, disk_dir, shm_dir))
            print(table(results[-1]), flush=True)
    finally:
        shutil.rmtree(shm_dir, ignore_errors=True)
        shutil.rmtree(disk_dir, ignore_errors=True)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    head = (f"## pmem_store.py — {stamp}, {platform.node()} ({os.cpu_count()} cores, CPU only, no PMEM: the pool "
            f"is a file on /dev/shm), `python benchmarks/pmem_store.py --sizes "
            f"{' '.join(str(s) for s in args.sizes)} --runs {args.runs}`\n\n"
            "Blocking = save + gate (until the tensors may change); until committed = the version sealed and "
            "current (pool) or the file fsync'ed and committed (file store, torch.save + fsync). Loads verify "
            "every CRC and copy out of the pool.\n")
    res = {"when": stamp, "args": vars(args), "results": results}
    keep("pmem_store", args.out, res, head + "\n" + "\n\n".join(table(r) for r in results), plot,
         publish=not args.no_results)


if __name__ == "__main__":
    main()
