"""Does interval="auto" keep the overhead within its budget q? The Lightning benchmark model
(lightning_overhead.py's transformer LM) trained with FastCheckpointIO and
TunedModelCheckpoint(every_n_train_steps="auto", overhead=q), against the same steps with no
checkpoints.

    python benchmarks/tuned_interval.py --qs 0.05 0.10 --runs 3

Per run: the tuner times --tune-warmup quiet steps (nothing saved), profiles, and from then
on checkpoints every f* steps, re-choosing f as its feedback measures what a checkpoint
really costs the steps. The overhead of the steps after the first checkpoint (+2 steps) is
taken against the same steps of the same round's run without checkpoints (rounds alternate
the configurations, so a slow spell of the VM hits both of a pair), and again from the
feedback's last re-choice on ("settled"). Printed with the first and last (N, p, f), the
measured cost per checkpoint, the CPU share training kept busy, and T_w; medians of --runs;
written to JSON + PNG and to benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import shutil
import statistics
import warnings

import lightning as L
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
from lightning_overhead import LM, StepTimer, Tokens  # noqa: E402
from helpers.results import keep  # noqa: E402

from lightning_fastckpt import FastCheckpointIO, TunedModelCheckpoint  # noqa: E402

warnings.filterwarnings("ignore")


def one_run(args, q: float | None, ckdir: str) -> dict:
    shutil.rmtree(ckdir, ignore_errors=True)
    torch.manual_seed(0)
    model = LM(args.vocab, args.d_model, args.layers, args.seq)
    timer = StepTimer()
    cbs: list = [timer]
    io = None
    if q is not None:
        io = FastCheckpointIO()
        cbs.append(TunedModelCheckpoint(dirpath=ckdir, every_n_train_steps="auto", overhead=q,
                                        warmup_steps=args.tune_warmup, save_top_k=1, monitor="step", mode="max"))
    t = L.Trainer(max_steps=args.steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                  enable_model_summary=False, enable_checkpointing=q is not None, callbacks=cbs,
                  plugins=[io] if io is not None else None, num_sanity_val_steps=0)
    data = torch.utils.data.DataLoader(Tokens(args.steps * args.batch, args.vocab, args.seq), batch_size=args.batch)
    t.fit(model, data)
    s = timer.starts
    out = {"step_times": [b - a for a, b in zip(s[:-1], s[1:])]}
    if q is not None:
        cb = cbs[-1]
        plan = cb.auto.plan
        out.update(q=q, interval=cb.auto.interval, concurrency=plan.concurrency, writers=plan.writers,
                   write_s=plan.write_s, planned_step_s=plan.step_s, tune_s=cb.tune_seconds,
                   history=cb.auto.history,
                   # warm-up: tuner warm-up, the profiling step, the first checkpoint and 2 more steps
                   measured_from=args.tune_warmup + 1 + plan.interval + 2)
    del t, model, io
    gc.collect()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qs", type=float, nargs="+", default=[0.05, 0.10])
    ap.add_argument("--d-model", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=16000)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=400, help="steps per run")
    ap.add_argument("--tune-warmup", type=int, default=30, help="quiet steps the tuner times first")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--no-results", action="store_true")
    args = ap.parse_args()
    ckdir = os.path.join(args.out, "tuned-ckpt")
    base_runs, auto_runs = [], {q: [] for q in args.qs}
    for r in range(args.runs):  # rounds: a slow spell of the VM spreads over every configuration
        base_runs.append(one_run(args, None, ckdir))
        for q in args.qs:
            auto_runs[q].append(one_run(args, q, ckdir))
        print(f"round {r + 1}/{args.runs} done", flush=True)
    shutil.rmtree(ckdir, ignore_errors=True)
    rows = []
    for q in args.qs:
        overheads, settled = [], []
        for run, base_run in zip(auto_runs[q], base_runs):  # paired: the round's own run without checkpoints
            lo = run["measured_from"]
            if lo >= args.steps - 5:
                continue
            overheads.append(sum(run["step_times"][lo:]) / sum(base_run["step_times"][lo:]) - 1)
            run["overhead"] = overheads[-1]
            # after the feedback's last re-choice (the tuner has learnt what a checkpoint costs)
            last = max(lo, run["history"][-1]["steps_timed"] + 2)
            if last < args.steps - 20:
                settled.append(sum(run["step_times"][last:]) / sum(base_run["step_times"][last:]) - 1)
                run["overhead_settled"], run["settled_from"] = settled[-1], last
            quiet = statistics.mean(run["step_times"][5:args.tune_warmup])
            run["overhead_in_run"] = statistics.mean(run["step_times"][lo:]) / quiet - 1
        in_run = [r["overhead_in_run"] * 100 for r in auto_runs[q] if "overhead_in_run" in r]
        med = lambda key: statistics.median(r[key] for r in auto_runs[q])  # noqa: E731
        rows.append({"q": q, "overhead_pct": statistics.median(overheads) * 100 if overheads else None,
                     "settled_pct": statistics.median(settled) * 100 if settled else None,
                     "settleds_pct": [o * 100 for o in settled],
                     "final_plans": [(r["history"][-1]["concurrency"], r["history"][-1]["writers"],
                                      r["history"][-1]["interval"]) for r in auto_runs[q]],
                     "cost_ms": [round(r["history"][-1]["cost_s"] * 1e3) for r in auto_runs[q]],
                     "busy": [round(r["history"][0]["busy"], 2) for r in auto_runs[q]],
                     "histories": [r["history"] for r in auto_runs[q]],  # every (re-)choice, when and why
                     "in_run_pct": statistics.median(in_run) if in_run else None, "in_runs_pct": in_run,
                     "overheads_pct": [o * 100 for o in overheads], "interval": med("interval"),
                     "write_s": med("write_s"), "planned_step_ms": med("planned_step_s") * 1e3,
                     "tune_s": med("tune_s"), "measured_steps": args.steps - med("measured_from"),
                     "plans": [(r["concurrency"], r["writers"], r["interval"]) for r in auto_runs[q]]})
        row = rows[-1]
        print(f"q={q:.0%}: plans (N, p, f) first {row['plans']}, last {row['final_plans']}, cost/ckpt "
              f"{row['cost_ms']} ms, busy {row['busy']}, T_w {row['write_s']:.3f} s, overhead "
              f"{row['overhead_pct']:.1f} % (runs: {', '.join(f'{o:.1f}' for o in row['overheads_pct'])}), settled "
              f"{row['settled_pct'] if row['settled_pct'] is None else round(row['settled_pct'], 1)} %", flush=True)
    res = {"when": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "args": vars(args), "rows": rows,
           "base_step_ms": statistics.median(statistics.median(b["step_times"][10:]) for b in base_runs) * 1e3}
    keep("tuned_interval", args.out, res, table(res), plot, publish=not args.no_results)
    print(table(res))


def table(res: dict) -> str:
    a = res["args"]
    lines = [f"## tuned_interval.py — {res['when']}, {platform.node()} ({os.cpu_count()} cores, CPU only), "
             f"`--d-model {a['d_model']} --layers {a['layers']} --vocab {a['vocab']} --steps {a['steps']} "
             f"--runs {a['runs']}`\n",
             f"Lightning, FastCheckpointIO + TunedModelCheckpoint(every_n_train_steps=\"auto\", overhead=q); "
             f"no-checkpoint step {res['base_step_ms']:.1f} ms. Overhead of the steps after the tuner's warm-up, "
             "profiling and first checkpoint, against the same steps of the same round's run without checkpoints "
             "(paired); 'settled': from the feedback's last re-choice on. Medians of the runs.\n",
             "| q | first (N*, p*, f*) per run | last (N, p, f) per run | cost per checkpoint (ms) | busy | T_w (s) | "
             "t at tuning (ms) | overhead, each run | median | settled, each run | median | within q + 1 point? | "
             "profiling pause (s) |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        ok = r["overhead_pct"] is not None and r["overhead_pct"] <= r["q"] * 100 + 1
        settled = "—" if r.get("settled_pct") is None else f"**{r['settled_pct']:.1f} %**"
        lines.append(f"| {r['q']:.0%} | {r['plans']} | {r.get('final_plans')} | {r.get('cost_ms')} | {r.get('busy')} | "
                     f"{r['write_s']:.3f} | {r['planned_step_ms']:.1f} | "
                     f"{', '.join(f'{o:.1f} %' for o in r['overheads_pct'])} | **{r['overhead_pct']:.1f} %** | "
                     f"{', '.join(f'{o:.1f} %' for o in r.get('settleds_pct', []))} | {settled} | "
                     f"{'yes' if ok else 'NO'} | {r['tune_s']:.1f} |")
    return "\n".join(lines)


def plot(res: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    qs = [r["q"] * 100 for r in res["rows"]]
    ax.plot(qs, qs, "k--", label="budget q")
    ax.plot(qs, [q + 1 for q in qs], "k:", label="q + 1 point")
    for r in res["rows"]:
        ax.scatter([r["q"] * 100] * len(r["overheads_pct"]), r["overheads_pct"], color="tab:blue", alpha=0.5)
    ax.plot(qs, [r["overhead_pct"] for r in res["rows"]], "o-", color="tab:blue", label="measured (median)")
    ax.set_xlabel("overhead budget q (%)")
    ax.set_ylabel("measured overhead (%)")
    ax.set_title("interval='auto' vs its budget")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
