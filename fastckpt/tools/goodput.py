"""Goodput under failures (PCcheck §5.2.3): useful iterations per second when a preemption
trace is replayed against a checkpointing system's measured costs.

A system is {name, step_s t, stall_s s (training blocked per checkpoint), write_s T_w (issue to
durable), concurrency N (checkpoints in flight at most), load_s l (reading one back),
restart_s (anything else a restart costs)}. replay() runs iterations of t; every f-th ends
with a checkpoint that blocks s and is durable T_w later; an (N+1)-th waits, at the end of
its iteration (the iteration's compute overlaps the writes in flight), for the oldest to be
durable — so in steady state f iterations take max(f·t, T_w/N) + s: PCcheck's model
(an iteration takes max(T_w/N, f·t) per checkpoint) plus the system's own stall. A failure at time τ stops everything: training resumes after l + restart from the
newest checkpoint durable by τ (PCcheck eq. 4 bounds what is lost: f·t + t·min(N·f, T_w/t)).
Goodput = iterations kept at the end / the trace's duration; ideal = 1 / t.

Trace CSV: one failure time per line, seconds from the start, in a column named `time_s`
(a header line is optional; `#` starts a comment). Duration: --duration, else the last time.
"""
from __future__ import annotations

import csv
import json
import random
from collections import deque
from dataclasses import dataclass

from ..errors import ConfigError


@dataclass
class System:
    name: str
    step_s: float
    stall_s: float
    write_s: float
    concurrency: int = 1
    load_s: float = 0.0
    restart_s: float = 0.0

    @classmethod
    def from_dict(cls, d: dict) -> "System":
        try:
            s = cls(**d)
        except TypeError as e:
            raise ConfigError(f"bad system {d.get('name', d)!r}: {e}") from None
        if s.step_s <= 0 or min(s.stall_s, s.write_s, s.load_s, s.restart_s) < 0 or s.concurrency < 1:
            raise ConfigError(f"system {s.name!r}: step_s > 0, times >= 0 and concurrency >= 1 are required")
        return s


def read_trace(path: str) -> list[float]:
    """Failure times (s) from a CSV whose first column is `time_s` (a header line naming it
    is optional; `#` lines are comments)."""
    times = []
    try:
        with open(path, newline="") as f:
            rows = csv.reader(line for line in f if line.strip() and not line.lstrip().startswith("#"))
            for n, row in enumerate(rows, 1):
                cell = row[0].strip() if row else ""
                if n == 1 and cell == "time_s":
                    continue
                try:
                    times.append(float(cell))
                except ValueError:
                    raise ConfigError(f"failure trace {path!r}, row {n}: {cell!r} is not a time in seconds "
                                      "(the first column is time_s; a header, if any, must name it)") from None
    except OSError as e:
        raise ConfigError(f"cannot read the failure trace {path!r}: {e.strerror}") from None
    if any(t < 0 for t in times):
        raise ConfigError(f"failure trace {path!r}: negative time")
    return sorted(times)


def synthetic_trace(mtbf_s: float, duration_s: float, seed: int = 0) -> list[float]:
    """Failures as a Poisson process with mean time between failures mtbf_s."""
    rng, t, out = random.Random(seed), 0.0, []
    while True:
        t += rng.expovariate(1.0 / mtbf_s)
        if t >= duration_s:
            return out
        out.append(t)


def write_trace(path: str, times: list[float], note: str) -> None:
    with open(path, "w") as f:
        f.write(f"# {note}\ntime_s\n")
        f.writelines(f"{t:.3f}\n" for t in times)


def replay(system: System, interval: int, failures: list[float], duration_s: float) -> dict:
    """Iterations kept, goodput and lost work for one system at one interval."""
    if interval < 1:
        raise ConfigError("interval must be >= 1")
    s = system
    now, step, durable, lost, failures_seen = 0.0, 0, 0, 0, 0
    inflight: deque = deque()  # (step, durable_at), oldest first
    fails = deque(f for f in failures if f < duration_s)

    def land(until: float) -> int:
        nonlocal durable
        while inflight and inflight[0][1] <= until:
            durable = max(durable, inflight.popleft()[0])
        return durable

    while True:
        ckpt = (step + 1) % interval == 0
        cost = s.step_s
        if ckpt:  # at the end of the compute, the oldest of N in flight must be durable first
            computed = now + s.step_s
            still = [at for _, at in inflight if at > computed]
            if len(still) >= s.concurrency:
                cost += still[len(still) - s.concurrency] - computed
            cost += s.stall_s
        end = now + cost
        if fails and fails[0] < min(end, duration_s):  # a failure: back to the newest durable step
            now = max(now, fails.popleft())
            land(now)
            lost += step - durable
            failures_seen += 1
            step = durable
            inflight.clear()
            now += s.load_s + s.restart_s
            continue
        if end > duration_s:
            break
        now, step = end, step + 1
        if ckpt:
            land(now)
            if len(inflight) >= s.concurrency:
                durable = max(durable, inflight.popleft()[0])
            inflight.append((step, now + s.write_s))
    bound = s.load_s + interval * s.step_s + s.step_s * min(s.concurrency * interval, s.write_s / s.step_s)
    return {"system": s.name, "interval": interval, "iterations": step, "goodput": step / duration_s,
            "ideal": 1.0 / s.step_s, "failures": failures_seen, "lost_iterations": lost, "recovery_bound_s": bound}


def sweep(systems: list[System], intervals: list[int], failures: list[float], duration_s: float) -> list[dict]:
    return [replay(s, f, failures, duration_s) for s in systems for f in intervals]


def peaks(rows: list[dict]) -> dict[str, dict]:
    """Each system's row of highest goodput."""
    best: dict[str, dict] = {}
    for r in rows:
        if r["system"] not in best or r["goodput"] > best[r["system"]]["goodput"]:
            best[r["system"]] = r
    return best


def plot(rows: list[dict], path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for name in dict.fromkeys(r["system"] for r in rows):
        mine = [r for r in rows if r["system"] == name]
        ax.plot([r["interval"] for r in mine], [r["goodput"] for r in mine], marker="o", label=name)
    ax.axhline(max(r["ideal"] for r in rows), color="k", ls="--", label="no checkpoints, no failures")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (iterations)")
    ax.set_ylabel("goodput (iterations / s)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def systems_from(path: str) -> list[System]:
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read systems {path!r}: {e}") from None
    items = raw["systems"] if isinstance(raw, dict) and "systems" in raw else raw
    if not isinstance(items, list) or not items:
        raise ConfigError(f"{path!r}: a JSON list of systems (or {{'systems': [...]}}) is expected")
    return [System.from_dict(d) for d in items]


__all__ = ["System", "read_trace", "synthetic_trace", "write_trace", "replay", "sweep", "peaks", "plot",
           "systems_from"]
