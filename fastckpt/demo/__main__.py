"""`python -m fastckpt.demo [hydra overrides]` — the main job of the README.

1. reference run: uninterrupted, checkpointing with torch.save + fsync;
2. fastckpt run, killed with SIGKILL at `demo.kill_at`;
3. fastckpt run resumed from the newest valid checkpoint to the end;
then prints stall per checkpoint, throughput, whether the checkpoint the resumed run
loaded is bit for bit the state the killed run saved (what fastckpt owns), and whether
the resumed model is bit-identical to the reference. When it is not, the reference runs
once more: if the two uninterrupted runs differ, training on this machine is not
reproducible and the demo says so instead of blaming the checkpoint. It exits non-zero
only for a fastckpt failure.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import statistics
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from queue import Empty
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from fastckpt.demo.digest import saved_digests
from fastckpt.demo.train import run

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")


def launch(d: dict, ckpt: dict | None, mode: str, kill_at: int | None = None) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=run, args=(d, ckpt, mode, queue))
    proc.start()
    out = {"resumed": None}
    bar = tqdm(total=d["steps"], desc=f"{mode}{' (to be killed)' if kill_at else ''}", unit="step",
               disable=None, leave=False)  # quiet when not a terminal
    try:
        return _follow(proc, queue, out, bar, mode, kill_at)
    finally:
        bar.close()


def _follow(proc, queue, out: dict, bar, mode: str, kill_at: int | None) -> dict:
    while True:
        try:
            msg = queue.get(timeout=5)
        except Empty:
            if not proc.is_alive():
                raise RuntimeError(f"the {mode} training process died (exit code {proc.exitcode})") from None
            continue
        if msg[0] == "resumed":
            out["resumed"] = msg[1:]  # (step, digest of what load() returned, digest recorded at its save)
        elif msg[0] == "start":
            out["params"] = msg[2]
            bar.update(msg[1] - 1)
        elif msg[0] == "step":
            bar.update(1)
        if msg[0] == "step" and kill_at is not None and msg[1] >= kill_at:
            os.kill(proc.pid, signal.SIGKILL)
            proc.join()
            out["killed_at"] = msg[1]
            return out
        elif msg[0] == "done":
            proc.join()
            out.update(msg[1])
            return out


def spread(values: list[float], unit: float = 1e3) -> str:
    """median (quartiles, n) of values, in ms by default."""
    if not values:
        return "n=0"
    if len(values) < 4:
        return f"{statistics.median(values) * unit:.2f} (n={len(values)})"
    q1, med, q3 = statistics.quantiles(values, n=4)
    return f"{med * unit:.2f} (quartiles {q1 * unit:.2f}-{q3 * unit:.2f}, n={len(values)})"


def over(r: dict, first: int) -> tuple[list[float], list[float]]:
    """(stalls, step times) of the steps from `first` on: every run's figures over the same steps."""
    return ([s for step, s in r["stalls"] if step >= first], [t for step, t in r["step_times"] if step >= first])


def describe(name: str, r: dict, first: int) -> str:
    stalls, times = over(r, first)
    return (f"{name:<26} step {spread(times)} ms   stall per checkpoint {spread(stalls)} ms   "
            f"final loss {r['loss']:.4f}   weights {r['digest']}")


def size_of(path: str) -> int:
    """Bytes kept at the root: a folder's files, a pool file, or an s3:// prefix's committed checkpoints."""
    if path.startswith("s3://"):
        from fastckpt.store import S3Store
        store = S3Store(path)
        try:
            return sum(info.bytes for info in store.committed())
        finally:
            store.close()
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(here, f)) for here, _, files in os.walk(path) for f in files)


def unknown_override(args: list[str]) -> str | None:
    """The first command-line override naming a key the config does not have, said as we say it
    (Hydra's own words are 'use +key'), or None. `+key=...` is left to check() after composing."""
    from fastckpt.config import GROUP_KEYS
    groups = [g for g in os.listdir(CONFIGS) if os.path.isdir(os.path.join(CONFIGS, g))]
    config = OmegaConf.load(os.path.join(CONFIGS, "config.yaml"))
    top = (set(config) - {"defaults"}) | set(groups) | {"demo", "hydra"}
    chosen = {g: str(c) for entry in config.defaults if not isinstance(entry, str) for g, c in entry.items()}
    group_of = {k: g for g, keys in GROUP_KEYS.items() for k in keys}
    chosen.update(a.split("=", 1) for a in args if "=" in a and a.split("=", 1)[0] in groups)
    for arg in args:
        if arg.startswith(("-", "+", "~")) or "=" not in arg:
            continue
        key = arg.split("=", 1)[0]
        head, _, rest = key.partition(".")
        if head == "hydra":
            continue
        if head not in top and head in group_of:
            return f"{head!r} is set in its group: {group_of[head]}.{arg}"
        if head not in top:
            return f"unknown setting {head!r} in {arg!r}; valid: {', '.join(sorted(top))}"
        if not rest:
            continue
        if head == "demo":
            where, valid = "demo", set(OmegaConf.load(os.path.join(CONFIGS, "demo.yaml")).demo)
        elif head in chosen:
            where = f"{head}={chosen[head]}"
            try:
                valid = set(OmegaConf.load(os.path.join(CONFIGS, head, f"{chosen[head]}.yaml")))
            except FileNotFoundError:
                continue  # an unknown choice: Hydra's own error lists the choices
        else:
            continue
        if rest.split(".")[0] not in valid:
            return f"unknown setting {rest!r} of {where} in {arg!r}; valid: {', '.join(sorted(valid))}"
    return None


@hydra.main(config_path=CONFIGS, config_name="demo", version_base="1.3")
def demo(cfg: DictConfig) -> None:
    from fastckpt.config.hydra import check
    from fastckpt.errors import ConfigError
    try:
        check(cfg)  # the whole config, before a minute of work is spent on it
    except ConfigError as e:
        print(f"fastckpt demo: {e}", file=sys.stderr)
        sys.exit(2)
    cfg = OmegaConf.to_container(cfg, resolve=True)
    d = cfg.pop("demo")
    out_dir = HydraConfig.get().runtime.output_dir
    d["torch_dir"] = os.path.join(out_dir, "torch_save")  # the reference's files: removed at the end
    d["keep"] = cfg["keep"]
    d["saved"] = os.path.join(out_dir, "saved-digests.jsonl")  # the killed run's saved states, digested
    every = "by tune=auto" if (cfg.get("tune") or {}).get("enabled") else f"every {d['every']}"
    print(f"fastckpt demo: {d['steps']} steps, checkpoint {every}, kill -9 at step "
          f"{d['kill_at']}; strategy={cfg['strategy']['name']} root={cfg['root']}", flush=True)
    ref = launch(d, None, "torch.save")
    print(f"model: {ref['params'] / 1e6:.2f} M parameters (+ Adam state)")
    first = launch(dict(d, record=True), cfg, "fastckpt", kill_at=d["kill_at"])
    print(f"run 1 (fastckpt): killed with SIGKILL at step {first['killed_at']}")
    second = launch(d, cfg, "fastckpt")
    resumed_at = second["resumed"][0] if second["resumed"] else 0
    print(f"run 2 (fastckpt): resumed from step {resumed_at}, trained to step {d['steps']}")
    first_step = resumed_at + 1  # both runs' figures over the steps the resumed run trained
    print(f"steps {first_step}-{d['steps']}, median (quartiles, n):")
    print(describe("torch.save + fsync", ref, first_step))
    print(describe("fastckpt (after resume)", second, first_step))
    if second.get("offload"):
        o = second["offload"]
        print(f"activation offload: {o['offloaded']} activations ({o['bytes'] / 2**20:.0f} MiB) went to files "
              f"and back ({o['shared']} shared), {o['kept']} small ones stayed; tools tried: {', '.join(o['tools'])}")
    if second.get("tuned"):
        for t in second["tuned"]:
            print(f"tune=auto, {t['event']}: concurrency={t['concurrency']} writers={t['writers']} "
                  f"interval={t['interval']} steps (step {t['step_s'] * 1e3:.0f} ms)")
    ref_stalls, fast_stalls = over(ref, first_step)[0], over(second, first_step)[0]
    if ref_stalls and fast_stalls:
        a, b = statistics.median(ref_stalls), statistics.median(fast_stalls)
        print(f"stall per checkpoint, median over the same steps: torch.save + fsync {a * 1e3:.2f} ms, "
              f"fastckpt {b * 1e3:.2f} ms ({a / max(b, 1e-9):.1f}x)")
    again = None
    if second["digest"] != ref["digest"]:  # is training itself reproducible here? the reference once more
        again = launch(d, None, "torch.save")["digest"]
    shutil.rmtree(d["torch_dir"], ignore_errors=True)
    where = cfg["root"]
    kept = f"{size_of(where) / 2**20:.1f} MiB"
    print(f"fastckpt's checkpoints: {where} ({kept}, the newest {cfg['keep']} kept); the torch.save reference "
          f"files were removed; this run's folder: {out_dir}")
    lines, failed = verdict(second["resumed"], ref["digest"], second["digest"], again,
                            issued=bool(saved_digests(d["saved"])))
    print("\n".join(lines))
    if failed:
        sys.exit(1)  # Hydra drops the task's return value: the exit status says it


def verdict(resumed: tuple | None, reference: str, final: str, reference_again: str | None,
            issued: bool = True) -> tuple[list[str], bool]:
    """The demo's last lines and whether fastckpt failed.

    resumed: (step, digest of what load() returned, digest recorded when that step was saved,
    None when none was) or None when the second run found no checkpoint; issued: the killed run
    issued a save before the kill; reference / final: the weights of the
    uninterrupted run and of the resumed one; reference_again: the uninterrupted run's weights
    once more, measured only when the two differ. fastckpt failed when the checkpoint it loaded
    is not the state it was given, or when training is shown reproducible (the reference run
    twice alike) and the resumed run still ends elsewhere."""
    if resumed is None and not issued:
        return ["no checkpoint to resume from: the kill came before the first save (demo.kill_at < demo.every)"], False
    if resumed is None:
        return ["checkpoint equals the state saved: NO (saves were issued before the kill, and the resumed run "
                "found none committed)"], True
    step, loaded, saved = resumed
    if saved is None:  # not saved by the killed run (a root holding checkpoints from before this demo)
        lines = [f"checkpoint at step {step} equals the state saved: not known (the killed run recorded no "
                 "save at that step: was the root holding checkpoints from before this run?)"]
        held = True  # nothing shows fastckpt failed; nothing shows it held either, and the line says so
    else:
        held = loaded == saved
        lines = [f"checkpoint at step {step} equals the state saved: "
                 + ("YES" if held else f"NO (saved {saved}, loaded {loaded})")]
    if final == reference:
        return lines + ["resumed model bit-identical to the uninterrupted run: YES"], not held
    if reference_again is not None and reference_again != reference:
        return lines + [f"resumed model bit-identical to the uninterrupted run: NO, and not the checkpoint's doing: "
                        f"training on this machine is not reproducible (the uninterrupted run, run twice, ended "
                        f"with weights {reference} and {reference_again}; see the README, 'bit-exact resume: "
                        f"what it takes')"], not held
    return lines + [f"resumed model bit-identical to the uninterrupted run: NO (weights {final}; the uninterrupted "
                    f"run ended with {reference}" + (", twice)" if reference_again else ")")], True


def main() -> int:
    bad = unknown_override(sys.argv[1:])
    if bad:
        print(f"fastckpt demo: {bad}", file=sys.stderr)
        return 2
    demo()
    return 0


if __name__ == "__main__":
    sys.exit(main())
