"""Layer-wise snapshots against plain strategy c under DDP (LightCheck §III-B), same run.

LightCheck's claim: pipelining each bucket's snapshot copy with its gradient all-reduce hides
the copy. Here Lightning trains the benchmark LM with DDP on 2 ranks (gloo on CPU; NCCL, one
GPU per rank, where a machine has them) and a ModelCheckpoint every k steps through
FastCheckpointIO: with no checkpoints, plain `c` (the gate before the optimizer step waits for
the whole copy) and `c` + LayerwiseCheckpointing (each bucket's copy starts in its comm hook,
during the next step's backward). Each run is a fresh pair of processes (Lightning's own DDP
launcher); configurations run in rounds, --runs rounds; rank 0's step times are reported:
median step, stall per checkpoint (median checkpoint step minus the same round's no-checkpoint
median) and steady-state overhead over the measured steps.

    python benchmarks/layerwise_ddp.py                      # ~10 min on the 2-core VM
    python benchmarks/layerwise_ddp.py --ks 2 --runs 1 --steps 8 --d-model 128 --layers 2
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
from helpers.results import keep  # noqa: E402

CONFIGS = ("none", "c", "layerwise")


def one_run(args, config: str, k: int) -> dict | None:
    """One DDP fit (this process is rank 0 or, re-launched by Lightning, rank 1)."""
    import torch
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.strategies import DDPStrategy

    from lightning_fastckpt import FastCheckpointIO, LayerwiseCheckpointing
    from lightning_overhead import LM, StepTimer, Tokens
    warnings.filterwarnings("ignore")
    ckdir = os.path.join(args.out, f"layerwise-ddp-{config}")
    torch.manual_seed(0)
    model = LM(args.vocab, args.d_model, args.layers, args.seq)
    timer = StepTimer()
    callbacks, plugins = [timer], []
    if config != "none":
        plugins.append(FastCheckpointIO(strategy="c", concurrency=2))
        callbacks.append(ModelCheckpoint(dirpath=ckdir, every_n_train_steps=k, save_top_k=1, monitor="step",
                                         mode="max"))
        if config == "layerwise":
            callbacks.append(LayerwiseCheckpointing())
    warmup = max(args.warmup, k + 2)
    steps = warmup + args.steps
    gpu = torch.cuda.is_available() and torch.cuda.device_count() >= 2
    trainer = L.Trainer(max_steps=steps, accelerator="gpu" if gpu else "cpu", devices=2,
                        strategy=DDPStrategy(process_group_backend="nccl" if gpu else "gloo"),
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=config != "none", callbacks=callbacks, plugins=plugins or None,
                        num_sanity_val_steps=0)
    data = torch.utils.data.DataLoader(Tokens(2 * steps * args.batch, args.vocab, args.seq), batch_size=args.batch)
    trainer.fit(model, data)
    if trainer.global_rank != 0:
        return None
    s = timer.starts
    times = [b - a for a, b in zip(s[:-1], s[1:])][warmup:]
    ck = [dt for i, dt in enumerate(times) if (warmup + i + 1) % k == 0]
    released = callbacks[-1]._io.held.released if config == "layerwise" else 0
    shutil.rmtree(ckdir, ignore_errors=True)
    return {"config": config, "k": k, "times": times, "ckpt_times": ck, "released": released,
            "backend": "nccl" if gpu else "gloo", "params": sum(p.numel() for p in model.parameters())}


def run_apart(args, config: str, k: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--one", config, str(k)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.child_timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{config} k={k} failed:\n{out.stdout[-2000:]}{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarize(runs_of: dict, ks, rounds: int) -> list[dict]:
    rows = []
    for k in ks:
        for config in CONFIGS[1:]:
            per = []
            for r in range(rounds):
                base, run = runs_of[("none", k)][r], runs_of[(config, k)][r]
                b = statistics.median(base["times"])
                per.append({"step": statistics.median(run["times"]),
                            "stall": statistics.median(run["ckpt_times"]) - b if run["ckpt_times"] else 0.0,
                            "overhead": sum(run["times"]) / sum(base["times"][:len(run["times"])]) - 1,
                            "released": run["released"]})
            rows.append({"config": config, "k": k, "runs": per,
                         **{key: statistics.median(p[key] for p in per) for key in ("step", "stall", "overhead")},
                         "released": per[0]["released"],
                         "base_step": statistics.median(statistics.median(runs_of[("none", k)][r]["times"])
                                                        for r in range(rounds))})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d-model", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=16000)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--steps", type=int, default=16, help="measured steps per run")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--child-timeout", type=float, default=600)
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--no-results", action="store_true")
    ap.add_argument("--one", nargs=2, metavar=("CONFIG", "K"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.one:
        got = one_run(args, args.one[0], int(args.one[1]))
        if got is not None:
            print(json.dumps(got), flush=True)
        return
    runs_of: dict = {(c, k): [] for k in args.ks for c in CONFIGS}
    for r in range(args.runs):
        for k in args.ks:
            for config in CONFIGS:
                runs_of[(config, k)].append(run_apart(args, config, k))
        print(f"round {r + 1}/{args.runs} done", flush=True)
    first = runs_of[(CONFIGS[0], args.ks[0])][0]
    res = {"when": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "args": vars(args),
           "backend": first["backend"], "params": first["params"], "rows": summarize(runs_of, args.ks, args.runs)}
    text = table(res)
    print(text)
    keep("layerwise_ddp", args.out, res, text, plot, publish=not args.no_results)


def table(res: dict) -> str:
    a = res["args"]
    head = (f"## layerwise_ddp.py — {res['when']}, {platform.node()} ({os.cpu_count()} cores), DDP on 2 ranks "
            f"({res['backend']}), `--d-model {a['d_model']} --layers {a['layers']} --ks "
            f"{' '.join(map(str, a['ks']))} --steps {a['steps']} --runs {a['runs']}`\n\n"
            f"{res['params'] / 1e6:.1f} M parameters; FastCheckpointIO strategy c (N=2) with a ModelCheckpoint every k "
            "steps, plain and with LayerwiseCheckpointing; rank 0's steps after a warm-up holding the first "
            f"checkpoint. Stall = median checkpoint step minus the same round's no-checkpoint median; overhead = "
            f"measured steps over the same round's no-checkpoint steps. Medians of {a['runs']} rounds.\n")
    lines = ["| k | config | no-checkpoint step (ms) | step (ms) | stall per checkpoint (ms) | overhead | "
             "records released by bucket hooks |", "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['k']} | {r['config']} | {r['base_step'] * 1e3:.1f} | {r['step'] * 1e3:.1f} | "
                     f"{r['stall'] * 1e3:.1f} | {r['overhead'] * 100:+.1f} % | {r['released']} |")
    return head + "\n" + "\n".join(lines)


def plot(res: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for config in CONFIGS[1:]:
        pts = [(r["k"], r["stall"] * 1e3) for r in res["rows"] if r["config"] == config]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=config)
    ax.set_xlabel("checkpoint every k steps")
    ax.set_ylabel("stall per checkpoint (ms)")
    ax.set_title(f"DDP, 2 ranks ({res['backend']}): layer-wise vs plain c")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
