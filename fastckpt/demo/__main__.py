"""`python -m fastckpt.demo [hydra overrides]` — the main job of the README.

1. reference run: uninterrupted, checkpointing with torch.save + fsync;
2. fastckpt run, killed with SIGKILL at `demo.kill_at`;
3. fastckpt run resumed from the newest valid checkpoint to the end;
then prints stall per checkpoint, throughput, and whether the resumed model is
bit-identical to the reference.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import statistics
import sys

import hydra
from queue import Empty
from omegaconf import DictConfig, OmegaConf

from fastckpt.demo.train import run

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")


def launch(d: dict, ckpt: dict | None, mode: str, kill_at: int | None = None) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=run, args=(d, ckpt, mode, queue))
    proc.start()
    out = {"resumed": None}
    while True:
        try:
            msg = queue.get(timeout=5)
        except Empty:
            if not proc.is_alive():
                raise RuntimeError(f"the {mode} training process died (exit code {proc.exitcode})") from None
            continue
        if msg[0] == "resumed":
            out["resumed"] = msg[1]
        elif msg[0] == "start":
            out["params"] = msg[2]
        elif msg[0] == "step" and kill_at is not None and msg[1] >= kill_at:
            os.kill(proc.pid, signal.SIGKILL)
            proc.join()
            out["killed_at"] = msg[1]
            return out
        elif msg[0] == "done":
            proc.join()
            out.update(msg[1])
            return out


def describe(name: str, r: dict) -> str:
    med = statistics.median(r["stalls"]) * 1e3 if r["stalls"] else float("nan")
    return (f"{name:<28} {r['steps'] / r['seconds']:8.2f} steps/s   stall/ckpt median {med:8.2f} ms "
            f"(n={len(r['stalls'])})   final loss {r['loss']:.4f}   weights {r['digest']}")


@hydra.main(config_path=CONFIGS, config_name="demo", version_base="1.3")
def main(cfg: DictConfig) -> int:
    cfg = OmegaConf.to_container(cfg, resolve=True)
    d = cfg.pop("demo")
    d["torch_dir"] = os.path.join(os.path.dirname(cfg["root"]), "torch_save")
    every = "by tune=auto" if (cfg.get("tune") or {}).get("enabled") else f"every {d['every']}"
    print(f"fastckpt demo: {d['steps']} steps, checkpoint {every}, kill -9 at step "
          f"{d['kill_at']}; strategy={cfg['strategy']['name']} root={cfg['root']}", flush=True)
    ref = launch(d, None, "torch.save")
    print(f"model: {ref['params'] / 1e6:.2f} M parameters (+ Adam state)")
    first = launch(d, cfg, "fastckpt", kill_at=d["kill_at"])
    print(f"run 1 (fastckpt): killed with SIGKILL at step {first['killed_at']}")
    second = launch(d, cfg, "fastckpt")
    print(f"run 2 (fastckpt): resumed from step {second['resumed']}, trained to step {d['steps']}")
    print(describe("torch.save + fsync", ref))
    print(describe("fastckpt (after resume)", second))
    if second.get("offload"):
        o = second["offload"]
        print(f"activation offload: {o['offloaded']} activations ({o['bytes'] / 2**20:.0f} MiB) went to files "
              f"and back ({o['shared']} shared), {o['kept']} small ones stayed; tools tried: {', '.join(o['tools'])}")
    if second.get("tuned"):
        for t in second["tuned"]:
            print(f"tune=auto, {t['event']}: concurrency={t['concurrency']} writers={t['writers']} "
                  f"interval={t['interval']} steps (step {t['step_s'] * 1e3:.0f} ms)")
    exact = second["digest"] == ref["digest"]
    if ref["stalls"] and second["stalls"]:
        ratio = statistics.median(ref["stalls"]) / max(statistics.median(second["stalls"]), 1e-9)
        print(f"stall per checkpoint: fastckpt is {ratio:.1f}x shorter than torch.save + fsync")
    print(f"resumed model bit-identical to the uninterrupted run: {'YES' if exact else 'NO'}")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
