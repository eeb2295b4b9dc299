"""Training overhead of checkpointing every k steps under DeepSpeed: fastckpt vs the default engine.

The transformer LM of the Lightning benchmark (default ~64M parameters: a ~1 GiB tag of
module weights + fp32 partition + Adam moments), trained by a real deepspeed.initialize
engine (CPU accelerator, one gloo rank) under ZeRO-1 and ZeRO-3, with
`engine.save_checkpoint` every k steps: DeepSpeed's default TorchCheckpointEngine against
a "fastckpt" config entry (strategy c, N = 1..4).

Each run is one fresh process with one engine: a warm-up holding the first save, then
--steps/2 steps without saves, --steps steps with a save every k, and --steps/2 more
without saves (the quiet halves on both sides are the run's own baseline).
Per run: the time inside save_checkpoint (median), the stall per save = (saving phase - quiet
phase) / saves, i.e. everything a save costs the training loop including the gate before the
next optimizer step and the background write's share of the cores, the overhead %, and apart
the final wait after the saving phase until every tag is committed. The default engine calls torch.save
without fsync (its files may still be in the page cache when it returns); fastckpt's tags are
durable and committed when the final wait ends. Configurations run in rounds (every one once
per round), --runs rounds; medians are reported, with the ratio of each stall to the default
engine's and, measured in the same run, a memcpy and an O_DIRECT write of the tag's bytes.

    python benchmarks/deepspeed_overhead.py                         # ~40 min on 2 cores
    python benchmarks/deepspeed_overhead.py --stages 1 --ks 5 --runs 3 --d-model 384
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
import warnings

for _k, _v in (("DS_ACCELERATOR", "cpu"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533"),
               ("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402
import deepspeed  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
from helpers import bounds  # noqa: E402
from helpers.results import keep  # noqa: E402

import deepspeed_fastckpt  # noqa: E402,F401  (registers the engine)
from fastckpt.demo.train import TinyLM  # noqa: E402

warnings.filterwarnings("ignore")


def make_engine(args, stage: int, config: str):
    torch.manual_seed(0)
    model = TinyLM(args.vocab, args.d_model, args.layers, heads=8)
    cfg = {"train_batch_size": args.batch, "train_micro_batch_size_per_gpu": args.batch,
           "optimizer": {"type": "Adam", "params": {"lr": 1e-4, "torch_adam": True}},
           "zero_optimization": {"stage": stage}, "steps_per_print": 10**9, "wall_clock_breakdown": False}
    if config.startswith("fast-N"):
        cfg["fastckpt"] = {"strategy": "c", "concurrency": int(config[6:])}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine


def settle(engine) -> None:
    """Lets every earlier save finish, durable, before a phase is timed: fastckpt waits for its
    tags; for the default engine the kernel writes back the page-cache pages torch.save left."""
    wait = getattr(engine.checkpoint_engine, "wait", None)
    if wait is not None:
        wait()
    os.sync()


def timed_steps(engine, data, first: int, n: int, save_every: int, ckdir: str):
    """n training steps from data[first]; a save after the first of every save_every of them
    (0: none), so even the last save is followed by save_every - 1 timed steps that carry its
    background write. Returns (total seconds, times inside save_checkpoint)."""
    total, saves = 0.0, []
    for j, i in enumerate(range(first, first + n)):
        t0 = time.perf_counter()
        x, y = data[i, :, :-1], data[i, :, 1:]
        loss = torch.nn.functional.cross_entropy(engine(x).flatten(0, 1), y.flatten())
        engine.backward(loss)
        engine.step()
        if save_every and j % save_every == 0:
            s0 = time.perf_counter()
            engine.save_checkpoint(ckdir)
            saves.append(time.perf_counter() - s0)
        total += time.perf_counter() - t0
    return total, saves


def one_run(args, stage: int, config: str, k: int, ckdir: str) -> dict:
    """One engine: a warm-up holding the first save (staging allocated, pages touched), then
    steps/2 steps without saves, `steps` steps with a save every k, and steps/2 more without
    saves, the quiet halves being this run's own baseline. Stall per save = (saving phase -
    quiet steps scaled to the same count) / saves: both run in one process on one engine, so
    the process-to-process spread of a shared 2-core VM (±25 % between runs) stays out, and
    quiet steps on both sides cancel a drift within the run. Every save has finished (and
    the kernel has written back torch.save's pages) before a quiet half starts."""
    shutil.rmtree(ckdir, ignore_errors=True)
    engine = make_engine(args, stage, config)
    g = torch.Generator().manual_seed(0)
    half = max(1, args.steps // 2)
    data = torch.randint(0, args.vocab, (args.warmup + args.steps + 2 * half, args.batch, args.seq + 1), generator=g)
    timed_steps(engine, data, 0, args.warmup, args.warmup, ckdir)
    settle(engine)
    quiet_a, _ = timed_steps(engine, data, args.warmup, half, 0, ckdir)
    saving, save_times = timed_steps(engine, data, args.warmup + half, args.steps, k, ckdir)
    t0 = time.perf_counter()
    settle(engine)  # fastckpt: every tag in flight lands and commits
    final_wait = time.perf_counter() - t0
    quiet_b, _ = timed_steps(engine, data, args.warmup + half + args.steps, half, 0, ckdir)
    engine.destroy()
    tags = sorted((d for d in os.listdir(ckdir) if d.startswith("global_step")), key=lambda d: int(d[11:]))
    tag = os.path.join(ckdir, tags[-1])
    tag_bytes = sum(os.path.getsize(os.path.join(tag, f)) for f in os.listdir(tag))
    n_params = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in engine.module.parameters())
    return {"stage": stage, "config": config, "k": k, "quiet_total": (quiet_a + quiet_b) * args.steps / (2 * half),
            "quiet_a": quiet_a, "quiet_b": quiet_b, "saving_total": saving,
            "n_measured": args.steps, "saves": len(save_times), "save_call_median": statistics.median(save_times),
            "final_wait": final_wait, "tag_bytes": tag_bytes, "params": n_params}


def run_apart(stage: int, config: str, k: int, ckdir: str) -> dict:
    """One run in a fresh process: nothing of an earlier engine (staging memory, DeepSpeed's
    buffers) stays behind to crowd the next."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--one", str(stage), config, str(k)],
                         capture_output=True, text=True, env=dict(os.environ, MASTER_PORT=str(free_port())))
    if out.returncode != 0:
        raise RuntimeError(f"run ZeRO-{stage} {config} k={k} failed:\n{out.stdout[-2000:]}{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summarize(runs: list[dict]) -> dict:
    med = lambda f: statistics.median(f(r) for r in runs)  # noqa: E731
    return {"stage": runs[0]["stage"], "config": runs[0]["config"], "k": runs[0]["k"],
            "step_ms": med(lambda r: r["quiet_total"] / r["n_measured"]) * 1e3,
            "save_call_ms": med(lambda r: r["save_call_median"]) * 1e3,
            "stall_ms": med(lambda r: (r["saving_total"] - r["quiet_total"]) / r["saves"]) * 1e3,
            "overhead_pct": med(lambda r: r["saving_total"] / r["quiet_total"] - 1) * 100,
            "final_wait_ms": med(lambda r: r["final_wait"]) * 1e3, "tag_bytes": runs[0]["tag_bytes"], "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--stages", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 5])
    ap.add_argument("--configs", nargs="+", default=["torch", "fast-N1", "fast-N2", "fast-N4"])
    ap.add_argument("--steps", type=int, default=10, help="measured steps per run")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--no-results", action="store_true")
    ap.add_argument("--one", nargs=3, metavar=("STAGE", "CONFIG", "K"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    ckdir = os.path.join(args.out, "deepspeed-ckpt")
    if args.one:  # a child: one run, its result as the last line
        deepspeed.init_distributed(dist_backend="gloo")
        stage, config, k = int(args.one[0]), args.one[1], int(args.one[2])
        print(json.dumps(one_run(args, stage, config, k, ckdir)), flush=True)
        return
    plan = [(s, c, k) for s in args.stages for k in args.ks for c in args.configs]
    runs_of: dict = {key: [] for key in plan}
    for r in range(args.runs):  # rounds: a slow spell of a shared machine lands on every configuration
        for stage, config, k in plan:
            runs_of[(stage, config, k)].append(run_apart(stage, config, k, ckdir))
            got = runs_of[(stage, config, k)][-1]
            print(f"  ZeRO-{stage} {config} k={k}: {got['quiet_total']:.2f} s quiet, {got['saving_total']:.2f} s with "
                  f"{got['saves']} saves", flush=True)
        print(f"round {r + 1}/{args.runs} done", flush=True)
    shutil.rmtree(ckdir, ignore_errors=True)
    rows = [summarize(runs_of[key]) for key in plan]
    for row in rows:
        print(f"ZeRO-{row['stage']} k={row['k']:<3} {row['config']:<8} save call {row['save_call_ms']:8.1f} ms  "
              f"stall/save {row['stall_ms']:8.1f} ms  overhead {row['overhead_pct']:6.1f} %  "
              f"final wait {row['final_wait_ms']:6.0f} ms", flush=True)
    nbytes = max(r["tag_bytes"] for r in rows)
    bound = bounds.for_checkpoint(nbytes, args.out)
    res = {"when": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "args": vars(args),
           "deepspeed": deepspeed.__version__, "bounds": bound,
           "params": runs_of[plan[0]][0]["params"], "rows": rows}
    text = table(res)
    print(text)
    keep("deepspeed_overhead", args.out, res, text, plot, publish=not args.no_results)

def table(res: dict) -> str:
    a, b = res["args"], res["bounds"]
    head = (f"## deepspeed_overhead.py — {res['when']}, {platform.node()} ({os.cpu_count()} cores, CPU only, "
            f"DeepSpeed {res['deepspeed']}, one rank), `--d-model {a['d_model']} --layers {a['layers']} "
            f"--vocab {a['vocab']} --ks {' '.join(map(str, a['ks']))} --steps {a['steps']} --runs {a['runs']}`\n\n"
            f"{res['params'] / 1e6:.1f} M parameters; one tag ≈ {b['bytes'] / 2**30:.2f} GiB. Bounds for one tag, "
            f"same run: memcpy {b['memcpy_s'] * 1e3:.0f} ms, O_DIRECT write {b['direct_write_s'] * 1e3:.0f} ms. "
            f"Each run is one process: a warm-up holding the first save, {a['steps'] // 2} steps without saves, "
            f"{a['steps']} steps with a save every k, {a['steps'] // 2} more without saves (the quiet steps on both "
            "sides are the run's own baseline, \"step\"). Stall per save = (saving phase - as many quiet steps) / "
            "saves: everything a save adds to training, the save call, the gate "
            f"before the next optimizer step and the background write's share of the cores. Medians of {a['runs']} "
            "runs in rounds. The default engine's torch.save does not fsync; fastckpt's final wait ends with "
            "every tag durable and committed.\n")
    lines = ["| ZeRO | k | engine | step (ms) | save call (ms) | stall per save (ms) | stall / default | overhead | "
             "final wait (ms) |", "|---|---|---|---|---|---|---|---|---|"]
    by = {(r["stage"], r["k"], r["config"]): r for r in res["rows"]}
    for r in res["rows"]:
        peer = by.get((r["stage"], r["k"], "torch"))
        ratio = f"{r['stall_ms'] / peer['stall_ms']:.2f}×" if peer and r["config"] != "torch" else ""
        lines.append(f"| {r['stage']} | {r['k']} | {r['config']} | {r['step_ms']:.0f} | {r['save_call_ms']:.1f} | "
                     f"{r['stall_ms']:.1f} | {ratio} | {r['overhead_pct']:.1f} % | {r['final_wait_ms']:.0f} |")
    return head + "\n" + "\n".join(lines)


def plot(res: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    stages = res["args"]["stages"]
    fig, axes = plt.subplots(1, len(stages), figsize=(5 * len(stages), 4), squeeze=False)
    for ax, stage in zip(axes[0], stages):
        for config in res["args"]["configs"]:
            pts = [(r["k"], r["stall_ms"]) for r in res["rows"] if r["config"] == config and r["stage"] == stage]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=config)
        ax.set_xlabel("checkpoint every k steps")
        ax.set_ylabel("stall per save (ms)")
        ax.set_title(f"DeepSpeed ZeRO-{stage}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
