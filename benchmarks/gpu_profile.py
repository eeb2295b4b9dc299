"""Where a plain-loop fastckpt save's time goes on the device: torch.profiler over training steps
that each end with a save, per strategy (`make gpu-check GPU_CHECK=long` runs it on a GPU).

For each strategy (c and g by default) a process of its own (helpers/fresh.py) trains gpu_overhead.py's model: warm-up
steps with a save every step (staging grown, threads started), then --saves steps each ending
with a save, under torch.profiler (CPU and, on a GPU, CUDA activities). Written under --out:

  profile-<strategy>.json       the Chrome trace (chrome://tracing, ui.perfetto.dev)
  profile-<strategy>.txt        the top --top operations by self device time (CPU: self CPU time)
  profile.md                    both tables, and each profiled save's fastckpt.timings (ms)

    python benchmarks/gpu_profile.py --out benchmarks/out/profile                 # on a GPU
    python benchmarks/gpu_profile.py --d-model 32 --layers 1 --heads 2 --vocab 128 --seq 8 --batch 2
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
from helpers import contenders, fresh  # noqa: E402

PHASES = ("save", "plan", "staging", "begin", "start", "gate", "copied_at", "enqueue", "stream_wait", "copy",
          "chunk_wait", "crc", "put", "finish", "commit", "durable_at")


def profile_one(a, strategy: str) -> dict:
    """One strategy in this process: the profiled steps, their trace and table, each save's timings."""
    import torch
    import fastckpt
    from torch.profiler import ProfilerActivity, profile, record_function

    dev = contenders.device()
    model = contenders.make_model(a).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ckdir = os.path.join(a.scratch, f"profile-{strategy}")
    shutil.rmtree(ckdir, ignore_errors=True)
    ck = fastckpt.Checkpointer(ckdir, strategy=strategy, concurrency=a.concurrency, keep=2)
    pendings = []

    def step(i: int) -> None:
        x, y = contenders.tokens(a, i, dev)
        with contenders.autocast(dev):
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        with record_function("fastckpt.gate"):
            ck.gate()
        opt.step()
        opt.zero_grad(set_to_none=True)
        with record_function("fastckpt.save"):
            pendings.append(ck.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": i}, step=i))
        contenders.sync(dev)

    for i in range(a.warmup):
        step(i)
    ck.wait()
    pendings.clear()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    t0 = time.perf_counter()
    with profile(activities=activities, record_shapes=False) as prof:
        for i in range(a.warmup, a.warmup + a.saves):
            step(i)
        ck.wait()
    wall = time.perf_counter() - t0
    trace = os.path.join(a.out, f"profile-{strategy}.json")
    prof.export_chrome_trace(trace)
    sort = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    top = prof.key_averages().table(sort_by=sort, row_limit=a.top, max_name_column_width=60)
    with open(os.path.join(a.out, f"profile-{strategy}.txt"), "w") as f:
        f.write(top)
    saves = [p.timings for p in pendings]
    ck.close()
    shutil.rmtree(ckdir, ignore_errors=True)
    return {"strategy": strategy, "device": str(dev), "wall_s": wall, "saves": saves, "sort": sort,
            "top": top, "trace": os.path.basename(trace)}


def report(a, results: list) -> str:
    lines = [f"# gpu_profile.py — {time.strftime('%Y-%m-%d %H:%M')}, {results[0]['device'] if results else '?'}, "
             f"`--d-model {a.d_model} --layers {a.layers} --seq {a.seq} --batch {a.batch}`, {a.saves} profiled "
             "steps, each ending with a save\n"]
    for r in results:
        if "error" in r:
            lines.append(f"## {r['strategy']}: {r['error']}\n")
            continue
        lines.append(f"## strategy {r['strategy']}: {r['wall_s']:.2f} s for the profiled steps (trace: {r['trace']})\n")
        lines.append("fastckpt.timings of each profiled save, ms:\n")
        lines.append("| save | " + " | ".join(PHASES) + " |")
        lines.append("|---|" + "---:|" * len(PHASES))
        for n, t in enumerate(r["saves"]):
            lines.append(f"| {n + 1} | " + " | ".join(f"{t[p] * 1e3:.1f}" if p in t else "–" for p in PHASES) + " |")
        lines.append(f"\nTop {a.top} by {r['sort']}:\n\n```\n{r['top']}\n```\n")
    return "\n".join(lines)


def main() -> None:
    gpu = contenders.device().type == "cuda"
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d-model", type=int, default=2048 if gpu else 256)
    ap.add_argument("--layers", type=int, default=8 if gpu else 2)
    ap.add_argument("--heads", type=int, default=16 if gpu else 4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=1024 if gpu else 64)
    ap.add_argument("--batch", type=int, default=8 if gpu else 2)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--strategies", nargs="+", default=["c", "g"], choices=["c", "g", "d"])
    ap.add_argument("--warmup", type=int, default=3, help="steps with a save before profiling")
    ap.add_argument("--saves", type=int, default=3, help="profiled steps, each ending with a save")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--child-timeout", type=float, default=240)
    ap.add_argument("--out", default=os.path.join(HERE, "out", "profile"))
    ap.add_argument("--scratch", help="folder for the checkpoints (default: --out)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.scratch = a.scratch or a.out
    os.makedirs(a.out, exist_ok=True)
    if a.one:
        print(json.dumps(profile_one(a, a.one)), flush=True)
        return
    results = []
    for strategy in a.strategies:  # each in a process of its own (helpers/fresh.py): no staging or thread shared
        try:
            out = fresh.run(os.path.abspath(__file__), [*sys.argv[1:], "--one", strategy], main, a.child_timeout)
            if out.returncode != 0:
                tail = " | ".join((out.stdout + out.stderr).strip().splitlines()[-8:])
                results.append({"strategy": strategy, "error": f"exit {out.returncode}: {tail[-1200:]}"})
            else:
                results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        except subprocess.TimeoutExpired:
            results.append({"strategy": strategy, "error": f"HANG (no end within {a.child_timeout} s)"})
    text = report(a, results)
    with open(os.path.join(a.out, "profile.md"), "w") as f:
        f.write(text)
    print(text)
    if any("error" in r for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
