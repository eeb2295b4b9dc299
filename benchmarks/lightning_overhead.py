"""Training overhead of checkpointing every k steps in Lightning: fastckpt vs Lightning's own IO.

One transformer LM (default ~100M parameters + Adam state, so a checkpoint takes longer
than a step here), trained with no checkpoints; with TorchCheckpointIO; with
AsyncCheckpointIO(TorchCheckpointIO()); with FastCheckpointIO (strategy c, N=1 and N=2..4)
and with layer-wise snapshots; a ModelCheckpoint every k steps, keeping the newest file.

Per run: the median step time over the measured steps, the stall per checkpoint step
(median time of checkpoint steps minus the no-checkpoint median), the steady-state overhead
= (sum of measured steps) / (same steps without checkpoints) - 1, and, apart, the final wait
from the last step until every checkpoint is durable (paid once per fit, not per step).
The warm-up covers the first checkpoint (k + 2 steps at least): one-time setup is not
counted as per-step overhead.
Each configuration runs --runs times, in rounds (each round runs every configuration once);
medians are reported. The same run measures the
physical bounds for one checkpoint: a memcpy and an O_DIRECT write of the same bytes.

    python benchmarks/lightning_overhead.py                  # the full table (slow on 2 cores)
    python benchmarks/lightning_overhead.py --d-model 512 --layers 8 --ks 1 5 --runs 3
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import shutil
import statistics
import time
import warnings

import torch
import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

HERE = os.path.dirname(os.path.abspath(__file__))
from helpers import bounds  # noqa: E402
from helpers.results import keep  # noqa: E402

from fastckpt.demo.train import TinyLM  # noqa: E402
from lightning_fastckpt import FastCheckpointIO, LayerwiseCheckpointing  # noqa: E402

warnings.filterwarnings("ignore")


class LM(L.LightningModule):
    def __init__(self, vocab: int, d_model: int, layers: int, seq: int):
        super().__init__()
        self.net = TinyLM(vocab, d_model, layers, heads=8)
        self.vocab, self.seq = vocab, seq

    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x).flatten(0, 1), y.flatten())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-4)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, vocab: int, seq: int):
        g = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, vocab, (n, seq + 1), generator=g)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i, :-1], self.data[i, 1:]


class StepTimer(L.Callback):
    """Wall time of every step, from one batch start to the next (checkpointing included)."""

    def __init__(self):
        self.starts: list[float] = []

    def on_train_batch_start(self, *a):
        self.starts.append(time.perf_counter())

    def on_train_end(self, *a):
        self.starts.append(time.perf_counter())


def make_io(name: str):
    if name == "torch":
        return TorchCheckpointIO(), []
    if name == "async":
        return AsyncCheckpointIO(TorchCheckpointIO()), []
    if name.startswith("fast-N"):
        return FastCheckpointIO(strategy="c", concurrency=int(name[6:])), []
    if name == "layerwise":
        return FastCheckpointIO(strategy="c", concurrency=2), [LayerwiseCheckpointing()]
    return None, []


def one_run(args, config: str, k: int, ckdir: str) -> dict:
    shutil.rmtree(ckdir, ignore_errors=True)
    torch.manual_seed(0)
    model = LM(args.vocab, args.d_model, args.layers, args.seq)
    io, extra = make_io(config)
    timer = StepTimer()
    cbs = [timer, *extra]
    if io is not None:
        cbs.append(ModelCheckpoint(dirpath=ckdir, every_n_train_steps=k, save_top_k=1, monitor="step",
                                   mode="max"))
    warmup = warmup_steps(args, k)
    steps = warmup + args.steps
    t = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                  enable_model_summary=False, enable_checkpointing=io is not None, callbacks=cbs,
                  plugins=[io] if io is not None else None, num_sanity_val_steps=0)
    data = torch.utils.data.DataLoader(Tokens(steps * args.batch, args.vocab, args.seq), batch_size=args.batch)
    t0 = time.perf_counter()
    t.fit(model, data)  # teardown waits until every checkpoint is durable
    end = time.perf_counter()
    s = timer.starts
    step_times = [b - a for a, b in zip(s[:-1], s[1:])]
    measured = step_times[warmup:]
    ck_steps = [dt for i, dt in enumerate(step_times) if i >= warmup and (i + 1) % k == 0]
    n_params = sum(p.numel() for p in model.parameters())
    del t, model, io
    gc.collect()
    return {"config": config, "k": k, "step_median": statistics.median(measured),
            "ckpt_step_median": statistics.median(ck_steps) if ck_steps else None,
            "measured_total": sum(measured), "final_wait": end - s[-1], "params": n_params, "wall": end - t0}


def warmup_steps(args, k: int) -> int:
    """Warm-up includes the first checkpoint, so one-time setup (staging memory faulted in,
    writer threads started) is not counted as per-step overhead."""
    return max(args.warmup, k + 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 5, 10])
    ap.add_argument("--configs", nargs="+",
                    default=["torch", "async", "fast-N1", "fast-N2", "fast-N3", "fast-N4", "layerwise"])
    ap.add_argument("--steps", type=int, default=20, help="measured steps per run")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--no-results", action="store_true")
    ap.add_argument("--render", metavar="JSON", help="only re-render the table and plot of a saved run")
    args = ap.parse_args()
    if args.render:
        with open(args.render) as f:
            res = json.load(f)
        print(table(res))
        keep("lightning_overhead", os.path.dirname(os.path.abspath(args.render)), res, table(res), plot,
             publish=not args.no_results)
        return
    os.makedirs(args.out, exist_ok=True)
    ckdir = os.path.join(args.out, "lightning-ckpt")
    # Rounds: every configuration once per round, so slow spells of a shared machine spread
    # over all of them instead of landing on one.
    plan = [("none", 1)] + [(config, k) for k in args.ks for config in args.configs]
    runs_of: dict = {key: [] for key in plan}
    for r in range(args.runs):
        for config, k in plan:
            runs_of[(config, k)].append(one_run(args, config, k, ckdir))
        print(f"round {r + 1}/{args.runs} done", flush=True)
    base_runs = runs_of[("none", 1)]
    base = {"step": statistics.median(r["step_median"] for r in base_runs),
            "total": statistics.median(r["measured_total"] for r in base_runs)}
    print(f"no checkpoints: {base['step'] * 1e3:.1f} ms/step ({base_runs[0]['params'] / 1e6:.1f} M params)", flush=True)
    rows = []
    for config, k in plan[1:]:
        runs = runs_of[(config, k)]
        med = lambda key: statistics.median(r[key] for r in runs if r[key] is not None)  # noqa: E731
        row = {"config": config, "k": k, "step_ms": med("step_median") * 1e3,
               "stall_ms": (med("ckpt_step_median") - base["step"]) * 1e3,
               "overhead_pct": (med("measured_total") / base["total"] - 1) * 100,
               "final_wait_ms": med("final_wait") * 1e3, "runs": runs}
        rows.append(row)
        print(f"k={k:<3} {config:<10} step {row['step_ms']:8.1f} ms  stall/ckpt {row['stall_ms']:8.1f} ms  "
              f"overhead {row['overhead_pct']:6.1f} %  final wait {row['final_wait_ms']:6.0f} ms", flush=True)
    # physical bounds for one checkpoint of this model (weights + Adam: 3 x fp32 params)
    res = {"when": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "args": vars(args), "base": base,
           "bounds": bounds.for_checkpoint(base_runs[0]["params"] * 3 * 4, args.out), "rows": rows}
    text = table(res)
    print(text)
    keep("lightning_overhead", args.out, res, text, plot, publish=not args.no_results)

def table(res: dict) -> str:
    a, b = res["args"], res["bounds"]
    head = (f"## lightning_overhead.py — {res['when']}, {platform.node()} ({os.cpu_count()} cores, CPU only), "
            f"`--d-model {a['d_model']} --layers {a['layers']} --vocab {a['vocab']} --steps {a['steps']} "
            f"--runs {a['runs']}`\n\n"
            f"{res['rows'][0]['runs'][0]['params'] / 1e6:.1f} M parameters; checkpoint ≈ {b['bytes'] / 2**30:.2f} GiB. "
            f"No checkpoints: {res['base']['step'] * 1e3:.1f} ms/step. Bounds for one checkpoint, same run: "
            f"memcpy {b['memcpy_s'] * 1e3:.0f} ms, O_DIRECT write {b['direct_write_s'] * 1e3:.0f} ms "
            f"(= {b['direct_write_s'] / res['base']['step']:.1f} steps). Medians of {a['runs']} runs, run in "
            f"rounds; {a['steps']} measured steps after a warm-up that holds the first checkpoint; overhead = "
            "steady state over the measured steps; the final wait until every checkpoint is durable is "
            "paid once per fit and shown apart.\n")
    head += ("Memcpy floor = one memcpy of the checkpoint per k steps, over k steps: what a snapshot into "
             "host memory must cost at least where training already keeps every core busy.\n")
    lines = ["| k | config | ms/step | stall per checkpoint (ms) | overhead | memcpy floor | vs AsyncCheckpointIO "
             "| final wait (ms) |", "|---|---|---|---|---|---|---|---|"]
    by = {(r["k"], r["config"]): r for r in res["rows"]}
    for r in res["rows"]:
        peer = by.get((r["k"], "async"))
        vs = f"{r['overhead_pct'] - peer['overhead_pct']:+.1f} pts" if peer and r["config"] != "async" else ""
        floor = b["memcpy_s"] / (r["k"] * res["base"]["step"]) * 100
        lines.append(f"| {r['k']} | {r['config']} | {r['step_ms']:.1f} | {r['stall_ms']:.1f} | "
                     f"{r['overhead_pct']:.1f} % | {floor:.1f} % | {vs} | {r['final_wait_ms']:.0f} |")
    return head + "\n" + "\n".join(lines)


def plot(res: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for config in res["args"]["configs"]:
        pts = [(r["k"], r["overhead_pct"]) for r in res["rows"] if r["config"] == config]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=config)
    ax.set_xlabel("checkpoint every k steps")
    ax.set_ylabel("training overhead (%)")
    ax.set_xscale("log")
    ax.axhline(5, color="grey", lw=0.5, ls="--")
    ax.legend()
    ax.set_title("Lightning checkpoint overhead (median of runs)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
