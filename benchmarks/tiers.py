"""A memory tier in front of the disk, with a partner replica and a checkpoint on SIGTERM (issue 45's
figures), on 2 gloo ranks of this machine, each started fresh as a restarted job is.

    python benchmarks/tiers.py [--mb 512] [--runs 3] [--step-mb 64]

- Recovery: a checkpoint of --mb MiB per rank (tiers + replicas=1, durable on both tiers), both
  ranks killed (SIGKILL), then one of: nothing else (the memory tier alive), rank 1's memory tier
  wiped (its node lost: its part from the partner's replica), the whole memory tier wiped (the
  disk; its files evicted from the page cache first). Timed: from the restart's spawn to both
  ranks having loaded (every CRC checked) and taken a step ("to resumed"), and load() alone.
- SIGTERM to both ranks of a job training with preempt_signal=SIGTERM: until both exited with a
  durable checkpoint on the disk (the step checked there).
- Cost per step: a fixed step (about 40 ms of compute a rank, the ranks kept in step), a save of
  --step-mb MiB per rank every 5 steps, through no checkpoint, the disk alone (a root store), the
  memory tier (each save persisted to the disk), the memory tier persisting every 4th save
  (persist_every=4: the others in memory alone), and the memory tier + replica; the same run
  measures a memcpy and an O_DIRECT write of one rank's state. Then no checkpoint, the disk and
  both memory-tier contenders again with one rank (a core to spare, as beside a GPU's training:
  the copy behind the memory tier runs on idle CPU).
- Goodput (fastckpt.tools.goodput, PCcheck's replay) on the AWS spot trace, disk alone vs the memory
  tier, from the costs above (the memory tier's recovery: read from memory; the disk's: from disk).
- NVIDIA's resiliency extension (nvidia-resiliency-ext from the registry; helpers/nvrx_child.py):
  its local checkpointing (LocalCheckpointManager, each rank's folder on the memory tier's
  filesystem standing for its node's, CliqueReplicationStrategy pairing the 2 ranks) through the
  same three failures, and as a contender per step. On a host only its synchronous save runs (its
  asynchronous one calls torch.cuda.synchronize()); a failure it cannot recover from here is
  recorded with the error it raised. Skipped, and said so, where it is not installed.
Medians of --runs. Prints a table, writes JSON + PNG, and its section of benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
from helpers import bounds  # noqa: E402
from helpers.results import keep  # noqa: E402

import fastckpt  # noqa: E402
from fastckpt.tools import goodput as gp  # noqa: E402

CHILD = os.path.join(HERE, "helpers", "tiers_child.py")
NVRX_CHILD = os.path.join(HERE, "helpers", "nvrx_child.py")
FAILURES = {"process killed": "memory tier alive", "node lost": "rank 1's memory tier wiped",
            "memory tier lost": "the whole memory tier wiped"}
EVERY_N = 4  # the persist_every of the contender that persists every n-th memory-tier checkpoint
NVRX = "NVRx local + replica (sync)"  # NVIDIA's resiliency extension, as it runs on a host
CONTENDERS = ("none", "disk", "tiers", f"tiers, persist_every={EVERY_N}", "tiers+replica", NVRX)
ALONE = ("none", "disk", "tiers", f"tiers, persist_every={EVERY_N}")  # one rank, a core to spare: the copy behind the memory tier runs on idle CPU
EVERY = 5
SIGNAL_AT = 15  # the step after which the SIGTERM is sent (a save at 10 in flight or persisted)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def has_nvrx() -> bool:
    import importlib.util
    return importlib.util.find_spec("nvidia_resiliency_ext") is not None


def ranks(*args: str, world: int = 2, child: str = CHILD) -> list[subprocess.Popen]:
    port = free_port()
    return [subprocess.Popen([sys.executable, child, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True,
                             env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                                      MASTER_PORT=str(port), FASTCKPT_NODE=f"node-{r}", OMP_NUM_THREADS="1"))
            for r in range(world)]


def wait_line(proc: subprocess.Popen, prefix: str, timeout: float = 600) -> str:
    end = time.monotonic() + timeout
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(prefix):
            return line
        if time.monotonic() > end:
            break
    raise RuntimeError(f"no {prefix!r} line:\n{''.join(seen)[-3000:]}")


def kill(procs) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def evict(disk: str) -> None:
    for name in os.listdir(disk):
        if os.path.isdir(os.path.join(disk, name)):
            bounds.drop_folder(os.path.join(disk, name))


def recovery(failure: str, memory: str, disk: str, mb: int) -> dict:
    for d in (memory, disk):
        shutil.rmtree(d, ignore_errors=True)
    saving = ranks("save", memory, disk, str(mb))
    for p in saving:
        wait_line(p, "saved")
    kill(saving)
    if failure == "node lost":
        shutil.rmtree(os.path.join(memory, "rank-1"))
    elif failure == "memory tier lost":
        shutil.rmtree(memory)
    evict(disk)
    t0 = time.perf_counter()
    resuming = ranks("resume", memory, disk, str(mb))
    lines = [wait_line(p, "resumed").split() for p in resuming]
    for p in resuming:
        p.wait()
    total = time.perf_counter() - t0
    assert all(p.returncode == 0 for p in resuming), [p.returncode for p in resuming]
    return {"to_resumed_s": total, "load_s": max(float(x[1]) for x in lines),
            "from": [x[2] for x in lines]}


def nvrx_recovery(failure: str, local: str, mb: int) -> dict:
    """recovery() through NVIDIA's resiliency extension's local checkpointing: its folders under
    `local` (node-R for rank R) are what is left or wiped. A rank that fails to resume: its
    error, and the extension's frame it was raised from."""
    shutil.rmtree(local, ignore_errors=True)
    saving = ranks("save", local, str(mb), child=NVRX_CHILD)
    save_s = max(float(wait_line(p, "saved").split()[1]) for p in saving)
    kill(saving)
    if failure == "node lost":
        shutil.rmtree(os.path.join(local, "node-1"))
    elif failure == "memory tier lost":
        shutil.rmtree(local)
    t0 = time.perf_counter()
    resuming = ranks("resume", local, str(mb), child=NVRX_CHILD)
    out = [finished(p) for p in resuming]
    total = time.perf_counter() - t0
    shutil.rmtree(local, ignore_errors=True)
    if any(p.returncode != 0 for p in resuming):
        text = next(o for p, o in zip(resuming, out) if p.returncode != 0)
        return {"error": raised(text), "save_s": save_s}
    lines = [next(x for x in o.splitlines() if x.startswith("resumed")).split() for o in out]
    return {"to_resumed_s": total, "load_s": max(float(x[1]) for x in lines), "from": [x[2] for x in lines],
            "save_s": save_s}


def finished(p: subprocess.Popen, timeout: float = 300) -> str:
    """Its output once it exited; killed after timeout (a rank left waiting for a partner that died)."""
    try:
        return p.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        kill([p])
        return p.communicate()[0] + f"\nTimeoutError: no exit within {timeout:.0f} s"


def raised(text: str) -> str:
    """The last error line of a traceback, and the extension's deepest frame and line of code."""
    lines = [x.split("]:", 1)[-1].rstrip() for x in text.splitlines()]
    error = next((x.strip() for x in reversed(lines) if "Error" in x and not x.strip().startswith("File")), "?")
    at = [i for i, x in enumerate(lines) if "nvidia_resiliency_ext" in x and x.strip().startswith("File")]
    if not at:
        return error
    frame, code = lines[at[-1]].strip(), lines[at[-1] + 1].strip() if at[-1] + 1 < len(lines) else ""
    where = frame.split("nvidia_resiliency_ext/", 1)[-1].replace('", line', ":").replace(", in ", " ")
    return f"{error} (in {where}: `{code}`)"


def sigterm(memory: str, disk: str, mb: int) -> dict:
    for d in (memory, disk):
        shutil.rmtree(d, ignore_errors=True)
    job = ranks("preempt", memory, disk, str(mb))
    for p in job:
        wait_line(p, f"step {SIGNAL_AT}")
    t0 = time.perf_counter()
    for p in job:
        os.kill(p.pid, signal.SIGTERM)
    rest = [p.stdout.read() for p in job]
    for p in job:
        p.wait()
    took = time.perf_counter() - t0
    last = [max([SIGNAL_AT] + [int(x.split()[1]) for x in text.splitlines() if x.startswith("step ")]) for text in rest]
    with fastckpt.Checkpointer(disk) as ck:
        info = ck.latest(verified=True)
    ok = ([p.returncode for p in job] == [-signal.SIGTERM] * 2 and info is not None
          and info.step == last[0] == last[1])
    return {"to_durable_s": took, "step": info.step if info else None, "ok": ok}


def per_step(contender: str, memory: str, disk: str, mb: int, steps: int, world: int = 2) -> dict:
    for d in (memory, disk):
        shutil.rmtree(d, ignore_errors=True)
    if contender == NVRX:
        job = ranks("train", memory + "-nvrx", str(mb), str(steps), str(EVERY), world=world, child=NVRX_CHILD)
    else:
        job = ranks("train", memory, disk, str(mb), contender, str(steps), str(EVERY), world=world)
    out = [p.communicate()[0] for p in job]
    shutil.rmtree(memory + "-nvrx", ignore_errors=True)
    assert all(p.returncode == 0 for p in job), out
    times = [[float(t) for t in next(x for x in o.splitlines() if x.startswith("steps ")).split()[1:]] for o in out]
    waits = [float(next(x for x in o.splitlines() if x.startswith("final_wait")).split()[1]) for o in out]
    warm = [max(ts) for ts in zip(*times)][EVERY:]  # the slowest rank; the first interval is warm-up
    return {"step_s": statistics.mean(warm), "final_wait_s": max(waits)}


def med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def table(res: dict) -> str:
    mb = res["args"]["mb"]
    lines = [f"Run {res['when']} on {res['machine']}; {res['args']['runs']} runs, medians.", "",
             f"**Recovery** of a checkpoint of {mb} MiB per rank ({2 * mb / 1024:.2f} GiB over 2 ranks), "
             "from the restart's spawn (a fresh interpreter per rank) to both ranks loaded and stepped:", "",
             "| failure | what is left | part read from (rank 0, rank 1) | to resumed (s) | load() (s) |",
             "|---|---|---|---:|---:|"]
    for failure, rows in res["recovery"].items():
        where = " / ".join(x.replace(res["memory"], "memory").replace(res["disk"], "disk")
                           for x in rows[0]["from"])
        lines.append(f"| {failure} | {FAILURES[failure]} | {where} | {med(rows, 'to_resumed_s'):.2f} | "
                     f"{med(rows, 'load_s'):.3f} |")
    for failure, rows in res["nvrx_recovery"].items():
        failed = [x["error"] for x in rows if "error" in x]
        if failed:
            lines.append(f"| {failure}, NVRx | {FAILURES[failure]} | does not resume here: {failed[0]} | – | – |")
        elif "none" in rows[0]["from"]:
            lines.append(f"| {failure}, NVRx | {FAILURES[failure]} | nothing local: find_latest() found no "
                         "checkpoint (the job's global one is outside the extension) | – | – |")
        else:
            lines.append(f"| {failure}, NVRx | {FAILURES[failure]} | {' / '.join(rows[0]['from'])} | "
                         f"{med(rows, 'to_resumed_s'):.2f} | {med(rows, 'load_s'):.3f} |")
    r = res["recovery"]
    lines += ["", f"load() from memory is **{med(r['memory tier lost'], 'load_s') / med(r['process killed'], 'load_s'):.1f}x** "
              f"faster than from disk; from the partner's replica "
              f"{med(r['memory tier lost'], 'load_s') / med(r['node lost'], 'load_s'):.1f}x. To resumed (start-up "
              "included, the same for all): "
              f"{med(r['memory tier lost'], 'to_resumed_s') / med(r['process killed'], 'to_resumed_s'):.2f}x.", ""]
    s = res["sigterm"]
    lines += [f"**SIGTERM to durable** ({2 * mb / 1024:.2f} GiB over 2 ranks, preempt_signal=SIGTERM): "
              f"{med(s, 'to_durable_s'):.2f} s from the signal to both ranks exited with the agreed step durable "
              f"on disk; every run checked: {all(x['ok'] for x in s)}.", ""]
    b = res["bound"]
    base = med(res["per_step"]["none"], "step_s")
    lines += [f"**Cost per step**: a save of {res['args']['step_mb']} MiB per rank every {EVERY} steps "
              f"(memcpy of it {b['memcpy_s'] * 1e3:.1f} ms, O_DIRECT write {b['direct_write_s'] * 1e3:.1f} ms, "
              "measured in this run):", "",
              "| contender | step (ms) | over no checkpoint | wait at the end (s) |", "|---|---:|---:|---:|"]
    for c in res["per_step"]:
        rows = res["per_step"][c]
        lines.append(f"| {c} | {med(rows, 'step_s') * 1e3:.1f} | {100 * (med(rows, 'step_s') / base - 1):+.1f} % | "
                     f"{med(rows, 'final_wait_s'):.2f} |")
    pe = f"tiers, persist_every={EVERY_N}"
    lines += ["", f"`tiers` persists every save: the disk's write (and the check of the memory copy before it) "
              "on top of the memory tier's own save, so where training fills every core it costs more than "
              f"the disk alone. `{pe}` commits every save in memory (a killed process resumes from the "
              f"last one) and persists every {EVERY_N}th (close() and a preemption persist the newest): "
              f"{100 * (med(res['per_step'][pe], 'step_s') / med(res['per_step']['disk'], 'step_s') - 1):+.1f} % "
              "per step against the disk alone; in each run: "
              + ", ".join(f"{1e3 * a['step_s']:.1f} vs {1e3 * b['step_s']:.1f} ms"
                          for a, b in zip(res["per_step"][pe], res["per_step"]["disk"])) + "."]
    alone = med(res["alone"]["none"], "step_s")
    lines += ["", "The same with **one rank, a core to spare** (as beside a GPU's training, where the CPU idles: "
              "the copy behind the memory tier runs on the idle core; not the acceptance's configuration):", "",
              "| contender | step (ms) | over no checkpoint |", "|---|---:|---:|"]
    for c in ALONE:
        rows = res["alone"][c]
        lines.append(f"| {c} | {med(rows, 'step_s') * 1e3:.1f} | {100 * (med(rows, 'step_s') / alone - 1):+.1f} % |")
    g = res["goodput"]
    lines += ["", f"**Goodput** on {os.path.basename(g['trace'])} ({g['failures']} failures in {g['duration_s']:.0f} s), "
              "best interval each, the recovery priced as measured above; every failure taken as a lost "
              "process whose memory tier (or partner's replica) survives — a failure that takes a rank and "
              "its partner costs the memory tier a disk recovery instead:", "",
              "| system | best interval | goodput (it/s) | of ideal |", "|---|---:|---:|---:|"]
    for name, row in g["best"].items():
        lines.append(f"| {name} | {row['interval']} | {row['goodput']:.2f} | {100 * row['goodput'] * g['step_s']:.1f} % |")
    lines += ["", nvrx_note(res)]
    return "\n".join(lines)


def nvrx_note(res: dict) -> str:
    """What the NVRx rows above measured, and what they could not."""
    n = res["nvrx_recovery"]
    if not n:
        return "NVIDIA's resiliency extension was not run: nvidia-resiliency-ext is not installed here."
    ok = n["process killed"] and all("error" not in x for x in n["process killed"])
    saved = statistics.median(x["save_s"] for rows in n.values() for x in rows)
    text = (f"**NVIDIA's resiliency extension** (nvidia-resiliency-ext {res.get('nvrx_version', '?')}, local "
            "checkpointing with a clique of the 2 ranks as replicas; rows marked NVRx): on a host only its "
            f"synchronous save runs, and it blocked training {saved:.2f} s for the {res['args']['mb']} MiB per rank "
            "above (the exchange of the replicas, then torch.save of both parts, with no fsync and no checksum).")
    if ok:
        text += (f" After a killed process it loaded its own copy in {med(n['process killed'], 'load_s'):.3f} s "
                 f"against fastckpt's {med(res['recovery']['process killed'], 'load_s'):.3f} s (every CRC checked).")
    return text + (" A rank whose copy is gone must be sent its part by the partner, which that code does through "
                   "CUDA only (the error above), and with every local copy gone it finds nothing and leaves the "
                   "job to its global checkpoint, outside the extension: fastckpt reads the disk tier.")


def plot(res: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    names = list(res["recovery"])
    ax[0].bar(names, [med(res["recovery"][n], "load_s") for n in names])
    ax[0].set_ylabel("load() (s)")
    ax[0].set_title("recovery")
    ax[1].bar(list(res["per_step"]), [med(rows, "step_s") * 1e3 for rows in res["per_step"].values()])
    ax[1].set_ylabel("step (ms)")
    ax[1].set_title("cost per step")
    ax[1].tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=512, help="checkpoint per rank for recovery and SIGTERM (MiB)")
    ap.add_argument("--step-mb", type=int, default=64, help="checkpoint per rank for the cost per step (MiB)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work", default=os.path.join(HERE, "out", "tiers-work"))
    ap.add_argument("--memory", default="/dev/shm/fastckpt-bench-tiers")
    ap.add_argument("--trace", default=os.path.join(HERE, "traces", "aws_spot_g4dn_bamboo.csv"))
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--no-results", action="store_true")
    args = ap.parse_args()
    disk = os.path.join(os.path.abspath(args.work), "disk")
    os.makedirs(args.work, exist_ok=True)
    res = {"when": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "args": vars(args),
           "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
           "memory": args.memory, "disk": disk, "recovery": {f: [] for f in FAILURES}, "sigterm": [],
           "per_step": {c: [] for c in CONTENDERS if c != NVRX or has_nvrx()}, "alone": {c: [] for c in ALONE},
           "nvrx_recovery": {f: [] for f in FAILURES} if has_nvrx() else {}}
    if has_nvrx():
        from importlib.metadata import version
        res["nvrx_version"] = version("nvidia-resiliency-ext")
    else:
        print("nvidia-resiliency-ext is not installed (pip install nvidia-resiliency-ext): its rows are skipped")
    try:
        for run in range(args.runs):
            for failure in FAILURES:
                res["recovery"][failure].append(recovery(failure, args.memory, disk, args.mb))
                print(run, failure, res["recovery"][failure][-1], flush=True)
                if failure in res["nvrx_recovery"]:
                    res["nvrx_recovery"][failure].append(nvrx_recovery(failure, args.memory + "-nvrx", args.mb))
                    print(run, failure, "NVRx", res["nvrx_recovery"][failure][-1], flush=True)
            res["sigterm"].append(sigterm(args.memory, disk, args.mb))
            print(run, "sigterm", res["sigterm"][-1], flush=True)
            for c in res["per_step"]:
                res["per_step"][c].append(per_step(c, args.memory, disk, args.step_mb, args.steps))
                print(run, c, res["per_step"][c][-1], flush=True)
            for c in ALONE:
                res["alone"][c].append(per_step(c, args.memory, disk, args.step_mb, args.steps, world=1))
                print(run, "alone", c, res["alone"][c][-1], flush=True)
        res["bound"] = bounds.for_checkpoint(args.step_mb << 20, args.work)
    finally:
        for d in (args.memory, args.memory + "-nvrx", disk):
            shutil.rmtree(d, ignore_errors=True)
    res["goodput"] = goodput(res, args.trace)
    text = table(res)
    print(text)
    keep("tiers", args.out, res, text, plot, not args.no_results)


def goodput(res: dict, trace: str) -> dict:
    """The best interval of each on the trace: disk alone (its stall and time to durable, a
    recovery read from disk) and the memory tier (its stall, durable in memory at once, a
    recovery from memory), from the measured costs (per rank of --step-mb)."""
    failures = gp.read_trace(trace)
    duration = failures[-1] if failures else 0.0
    base = med(res["per_step"]["none"], "step_s")
    r = res["recovery"]
    start_s = med(r["process killed"], "to_resumed_s") - med(r["process killed"], "load_s")
    scale = res["args"]["step_mb"] / res["args"]["mb"]  # recovery was measured at --mb
    systems = []
    for name, contender, failure, write_s in (
            ("disk alone", "disk", "memory tier lost", res["bound"]["direct_write_s"] * 2),
            (f"memory tier, persist_every={EVERY_N}", f"tiers, persist_every={EVERY_N}", "process killed",
             res["bound"]["memcpy_s"] * 2),
            ("memory tier + replica", "tiers+replica", "process killed", res["bound"]["memcpy_s"] * 2)):
        stall = max(0.0, med(res["per_step"][contender], "step_s") - base) * EVERY
        systems.append(gp.System(name, base, stall, write_s, 2, med(r[failure], "load_s") * scale, start_s))
    rows = gp.sweep(systems, [1, 2, 5, 10, 20, 50, 100, 200, 500], failures, duration)
    return {"trace": trace, "failures": len(failures), "duration_s": duration, "step_s": base,
            "systems": [s.__dict__ for s in systems], "best": gp.peaks(rows)}


if __name__ == "__main__":
    main()
