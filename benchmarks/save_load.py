"""Save/load of a training state: fastckpt vs torch.save/load, DCP, Lightning-style async save,
Meta's torch_checkpointing, and the physical bounds (O_DIRECT write/read, memcpy) measured in the
same run.

    python benchmarks/save_load.py --sizes 0.125 1 4 --runs 3

Prints a table of medians and ratios, writes JSON to benchmarks/out/, and rewrites its own
section of benchmarks/RESULTS.md (between the save_load markers) with the figures it measured.
"""
from __future__ import annotations

import argparse
import gc
import datetime
import json
import os
import platform
import shutil
import statistics
import time

import torch
import torch.distributed as dist

from helpers import bounds, figure  # noqa: E402
from helpers import peers  # noqa: E402
from helpers.results import keep  # noqa: E402

import fastckpt  # noqa: E402
from fastckpt.timings import steady  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def make_state(gib: float) -> dict[str, torch.Tensor]:
    per = 16 << 20  # 16 MiB tensors, like the layers of a mid-sized model
    n = max(1, int(gib * (1 << 30)) // per)
    g = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.randn(per // 4, generator=g) for i in range(n)}


def touch(state: dict[str, torch.Tensor]) -> None:
    """Reads every tensor, as the training step just before a checkpoint has touched them all.

    Every contender that reads the state (the memcpy bound, every save) starts from it just
    touched, as the O_DIRECT bound starts from buffers it has just filled. Memory left idle for a
    second is slow to touch again on some machines (on this project's VM a copy of 4 KiB pages
    idle for 0.5-2 s ran 20-70x slower for tens of milliseconds, a pure-CPU loop did not), which
    would charge whichever contender runs after an idle spell for the machine's doing, not its
    own.

    It also runs Python's full garbage collection first: this process holds every contender's
    library (DCP, torch_checkpointing, Lightning-style threads) and their garbage, and a full
    collection it triggers took 75-485 ms here, landing on whichever contender happened to be
    running (a fastckpt save's plan once took 75 ms instead of 2 so); timeit turns collection off
    while it times, for the same reason."""
    gc.collect()
    for v in state.values():
        v.sum()


def fastckpt_save(ck: fastckpt.Checkpointer, state, step: int) -> dict:
    """One save on a long-lived Checkpointer (as in training: the staging pool is reused)."""
    t0 = time.perf_counter()
    p = ck.save(state, step=step)
    ck.gate()
    t_gate = time.perf_counter() - t0
    info = p.wait()
    return {"blocking": t_gate, "durable": time.perf_counter() - t0, "path": info.file_for(0), "timings": p.timings}


def fastckpt_load(root: str, mmap: bool | None = None, into: dict | None = None) -> float:
    ck = fastckpt.Checkpointer(root)
    t0 = time.perf_counter()
    ck.load(mmap=mmap, into=into)
    return time.perf_counter() - t0


def one_size(gib: float, runs: int, out_dir: str) -> dict:
    state = make_state(gib)
    nbytes = sum(v.numel() * v.element_size() for v in state.values())
    os.makedirs(out_dir, exist_ok=True)
    rows: dict[str, list[float]] = {}
    phases: dict[str, list[dict]] = {"c": [], "d": []}  # each measured save's Pending.timings

    def add(k, v):
        rows.setdefault(k, []).append(v)

    cks = {s: fastckpt.Checkpointer(os.path.join(out_dir, f"fc_{s}"), strategy=s, concurrency=1, keep=1)
           for s in ("c", "d")}
    try:
        tc = peers.TorchCheckpointing.opened(os.path.join(out_dir, "tc_probe"))
    except ImportError as e:  # an optional contender (make setup installs it)
        print(f"  torch_checkpointing left out: {e}", flush=True)
        tc = None
    into = {k: torch.empty_like(v) for k, v in state.items()}  # a load into existing tensors: both allocated once
    for r in range(runs + 1):  # round 0 warms every contender up and is discarded
        rec = add if r else (lambda k, v: None)
        touch(state)
        rec("memcpy", bounds.memcpy_seconds(state))
        raw = os.path.join(out_dir, "raw.bin")
        for threads, seconds in bounds.direct_write_each(raw, nbytes).items():
            rec(f"odirect_write_{threads}", seconds)
        bounds.drop_cache(raw)
        rec("odirect_read", bounds.direct_read_seconds(raw, nbytes))
        os.unlink(raw)
        for strategy, ck in cks.items():
            touch(state)
            res = fastckpt_save(ck, state, r + 1)
            rec(f"fastckpt_{strategy}_blocking", res["blocking"])
            rec(f"fastckpt_{strategy}_durable", res["durable"])
            if r:
                phases[strategy].append(res["timings"])
        bounds.drop_cache(res["path"])
        rec("fastckpt_load_cold", fastckpt_load(os.path.join(out_dir, "fc_d")))
        bounds.cache_file(res["path"])  # warm: the file in the page cache (a cold load leaves it out)
        rec("fastckpt_load_warm", fastckpt_load(os.path.join(out_dir, "fc_d")))
        rec("fastckpt_load_copy_warm", fastckpt_load(os.path.join(out_dir, "fc_d"), mmap=False))
        bounds.drop_cache(res["path"])
        rec("fastckpt_load_into_cold", fastckpt_load(os.path.join(out_dir, "fc_d"), into=into))
        tc_dir = os.path.join(out_dir, "torch_checkpointing")
        if tc is not None:
            touch(state)
            b, w, d = tc.save(state, tc_dir)
            rec("tc_blocking", b)
            rec("tc_written", w)
            rec("tc_durable", d)
            for folder, _, files in os.walk(tc_dir):
                for name in files:
                    bounds.drop_cache(os.path.join(folder, name))
            rec("tc_load_into_cold", tc.load(tc_dir, into))
        tpath = os.path.join(out_dir, "torch.pt")
        touch(state)
        rec("torch_save", peers.torch_save(state, tpath))
        bounds.drop_cache(tpath)
        rec("torch_load_cold", peers.torch_load(tpath))
        bounds.cache_file(tpath)
        rec("torch_load_warm", peers.torch_load(tpath))
        os.unlink(tpath)
        touch(state)
        rec("dcp_save", peers.dcp_save(state, os.path.join(out_dir, "dcp")))
        touch(state)
        b, t = peers.dcp_async_save(state, os.path.join(out_dir, "dcp_async"))
        rec("dcp_async_blocking", b)
        rec("dcp_async_durable", t)
        touch(state)
        b, t = peers.clone_thread_save(state, os.path.join(out_dir, "lightning.pt"))
        rec("clone_thread_blocking", b)
        rec("clone_thread_durable", t)
        for d in ("dcp", "dcp_async", "lightning.pt", "torch_checkpointing"):
            p = os.path.join(out_dir, d)
            shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else os.path.exists(p) and os.unlink(p)
        print(f"  round {r}/{runs} of {gib} GiB done{' (warm-up)' if r == 0 else ''}", flush=True)
    if tc is not None:
        tc.close()
    retain = {}  # deleting the save before (keep=1), after each landed: the mean per save
    for s, ck in cks.items():
        ck.close()  # the last retention ended
        retain[s] = steady([ck.stats]).get("retain", 0.0)
        shutil.rmtree(ck.root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    # The bound is the faster writer configuration, each taken as the median of its runs like every
    # contender: the faster of two draws in each run would also take the better of the disk's noise.
    med["odirect_write"] = min(med[f"odirect_write_{t}"] for t in bounds.WRITE_THREADS)
    timed = {s: {p: statistics.median(t.get(p, 0.0) for t in ts) for p in set().union(*ts)} | {"retain": retain[s]}
             for s, ts in phases.items() if ts}
    return {"gib": gib, "bytes": nbytes, "runs": runs, "median_s": med, "all_s": rows, "phases": timed,
            "torch_checkpointing": tc.note if tc is not None else None}


def _per_run(res: dict, strategy: str) -> str:
    """The stricter reading, where each run's bound is the faster of its two writers: the median of
    the runs' ratios."""
    a = res.get("all_s", {})
    writers = [a.get(f"odirect_write_{t}") for t in bounds.WRITE_THREADS]
    if not all(writers):
        return ""
    ratios = [min(w) / d for w, d in zip(zip(*writers), a[f"fastckpt_{strategy}_durable"])]
    return f" ({statistics.median(ratios):.2f}x each run's faster writer)"


def table(res: dict) -> str:
    m, gb = res["median_s"], res["bytes"] / 1e9
    bw = lambda k: gb / m[k]  # noqa: E731
    lines = [f"### {res['gib']} GiB state ({res['bytes'] / 2**30:.3f} GiB, median of {res['runs']} runs)", "",
             "| measure | seconds | GB/s | ratio |", "|---|---:|---:|---|"]
    lines[0] += ("; fastckpt on a long-lived Checkpointer (concurrency=1), every contender warmed up once,"
                 " the state read just before each contender that reads it (as by a training step);"
                 " fastckpt loads verify every CRC (every byte read): a cold file read around the page cache"
                 " (O_DIRECT), a warm one (in the page cache, read into it first) mapped; torch.load copies")

    def row(name, k, ratio=""):
        lines.append(f"| {name} | {m[k]:.3f} | {bw(k):.2f} | {ratio} |")

    row("memcpy (bound)", "memcpy")
    for t in bounds.WRITE_THREADS:
        if f"odirect_write_{t}" in m:  # older runs recorded the bound alone
            row(f"O_DIRECT write + fdatasync, {t} thread{'s' * (t > 1)}", f"odirect_write_{t}")
    row("O_DIRECT write + fdatasync (bound: the faster of those)", "odirect_write")
    row("O_DIRECT read, cold (bound)", "odirect_read")
    for s in ("c", "d"):
        row(f"fastckpt save `{s}`, until durable", f"fastckpt_{s}_durable",
            f"{m['odirect_write'] / m[f'fastckpt_{s}_durable']:.2f}x O_DIRECT write{_per_run(res, s)}; "
            f"{m['torch_save'] / m[f'fastckpt_{s}_durable']:.2f}x torch.save+fsync")
    tc = "tc_blocking" in m
    row("fastckpt save `c`, blocking (save+gate)", "fastckpt_c_blocking",
        f"{m['fastckpt_c_blocking'] / m['memcpy']:.2f}x memcpy" +
        (f"; {m['fastckpt_c_blocking'] / m['tc_blocking']:.2f}x torch_checkpointing's" if tc else ""))
    row("fastckpt save `d`, blocking (save+gate)", "fastckpt_d_blocking", "")
    row("torch.save + fsync", "torch_save")
    row("DCP save", "dcp_save")
    row("DCP async_save, blocking", "dcp_async_blocking", f"{m['dcp_async_blocking'] / m['memcpy']:.2f}x memcpy")
    row("DCP async_save, until durable", "dcp_async_durable")
    row("clone + thread save (Lightning-style), blocking", "clone_thread_blocking",
        f"{m['clone_thread_blocking'] / m['memcpy']:.2f}x memcpy")
    row("clone + thread save, until durable", "clone_thread_durable")
    if tc:
        row("torch_checkpointing save, blocking (save + lock())", "tc_blocking",
            f"{m['tc_blocking'] / m['memcpy']:.2f}x memcpy")
        row("torch_checkpointing save, until written (it never fsyncs)", "tc_written")
        row("torch_checkpointing save, until durable (+ fsync of its files)", "tc_durable",
            f"fastckpt `c` durable {m['tc_durable'] / m['fastckpt_c_durable']:.2f}x sooner")
    row("fastckpt load (verified), cold", "fastckpt_load_cold",
        f"{m['torch_load_cold'] / m['fastckpt_load_cold']:.2f}x torch.load cold")
    row("fastckpt load (verified), warm", "fastckpt_load_warm",
        f"{m['torch_load_warm'] / m['fastckpt_load_warm']:.2f}x torch.load warm")
    row("fastckpt load (verified, mmap=False copy), warm", "fastckpt_load_copy_warm",
        f"{m['torch_load_warm'] / m['fastckpt_load_copy_warm']:.2f}x torch.load warm")
    if tc:
        row("fastckpt load (verified) into existing tensors, cold", "fastckpt_load_into_cold",
            f"{m['tc_load_into_cold'] / m['fastckpt_load_into_cold']:.2f}x torch_checkpointing's")
        row("torch_checkpointing load into existing tensors, cold (nothing checked)", "tc_load_into_cold")
    row("torch.load, cold", "torch_load_cold")
    row("torch.load, warm", "torch_load_warm")
    if res.get("phases"):
        lines += ["", "Where fastckpt's saves went (Pending.timings, median of the runs, ms; copy, CRC and write are "
                  "summed over their threads; `written` = every data byte in the file, `durable` = committed; "
                  "`delete before` = removing the checkpoint before it (keep=1), after it landed, the mean per "
                  "save: off the save's own time, not off the disk's):", "",
                  "| strategy | save call | plan | begin | gate | copied | open | host copy | chunk wait | CRC | write "
                  "| written | finish + fdatasync | commit | durable | delete before |", "|---|" + "---:|" * 15]
        for s, t in res["phases"].items():
            cells = [t.get(p, 0.0) * 1e3 for p in ("save", "plan", "begin", "gate", "copied_at", "open", "copy",
                                                   "chunk_wait", "crc", "put", "written_at", "finish", "commit",
                                                   "durable_at", "retain")]
            lines.append(f"| `{s}` | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    if res.get("torch_checkpointing"):
        lines += ["", f"torch_checkpointing {_version('torch_checkpointing')} ran with {res['torch_checkpointing']}."]
    return "\n".join(lines)


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(package)
    except PackageNotFoundError:
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[0.125, 1.0, 4.0], help="GiB")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--no-results", action="store_true", help="do not rewrite RESULTS.md")
    ap.add_argument("--from-json", help="record the results of an earlier run (its save_load.json) instead of running")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        args.sizes = [r["gib"] for r in saved["results"]]
        args.runs = saved["results"][0]["runs"]
        return record(saved["when"], saved["results"], args)
    if not dist.is_initialized():  # DCP wants a process group; one gloo rank
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("gloo", rank=0, world_size=1)
    results = []
    for gib in args.sizes:
        print(f"== {gib} GiB ==", flush=True)
        results.append(one_size(gib, args.runs, args.out))
        print(table(results[-1]), flush=True)
    record(datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), results, args)


def record(stamp: str, results: list, args) -> None:
    header = (f"## save_load.py — {stamp}, {platform.node()} ({os.cpu_count()} cores, torch "
              f"{torch.__version__}, CPU only), `python benchmarks/save_load.py --sizes "
              f"{' '.join(str(s) for s in args.sizes)} --runs {args.runs}`")
    keep("save_load", args.out, {"when": stamp, "results": results},
         header + "\n\n" + "\n\n".join(table(r) for r in results), plot, publish=not args.no_results)


def plot(res: dict, path: str) -> None:
    """The largest state's run: training blocked, until durable, and load, for every contender and
    bound (helpers/figure.py)."""
    r = max(res["results"], key=lambda r: r["bytes"])
    m = r["median_s"]
    blocked = [("memcpy (bound)", m.get("memcpy")), ("fastckpt c: save + gate", m.get("fastckpt_c_blocking")),
               ("torch_checkpointing: save + lock", m.get("tc_blocking")),
               ("DCP async_save", m.get("dcp_async_blocking")), ("clone + thread (Lightning)", m.get("clone_thread_blocking"))]
    durable = [("O_DIRECT write (bound)", m.get("odirect_write")), ("fastckpt c", m.get("fastckpt_c_durable")),
               ("fastckpt d", m.get("fastckpt_d_durable")), ("torch_checkpointing + fsync", m.get("tc_durable")),
               ("torch.save + fsync", m.get("torch_save")), ("DCP save", m.get("dcp_save")),
               ("DCP async_save", m.get("dcp_async_durable"))]
    load = [("O_DIRECT read, cold (bound)", m.get("odirect_read")), ("fastckpt, verified", m.get("fastckpt_load_cold")),
            ("fastckpt into tensors, verified", m.get("fastckpt_load_into_cold")),
            ("torch_checkpointing into tensors", m.get("tc_load_into_cold")), ("torch.load", m.get("torch_load_cold"))]
    figure.panels(path, f"{r['gib']} GiB of float32 on the CPU, {r['runs']} runs (save_load.py)",
                  [("training blocked", blocked), ("until durable", durable), ("load, cold", load)])


if __name__ == "__main__":
    main()
