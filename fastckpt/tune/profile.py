"""How many checkpoints in flight and how often to take one (PCcheck §3.4), measured here.

    from fastckpt.tune.profile import profile, choose
    ms = profile(state, "/ckpt/tune", ns=(1, 2, 4), ps=(1, 2, 4))   # real saves on the real store
    plan = choose(ms, state_bytes=m, step_s=t, overhead=0.05, host_bytes=M, storage_bytes=S)
    plan.concurrency, plan.writers, plan.interval

profile() takes, for each N (concurrent checkpoints) and p (writers each), N checkpoints
issued back to back on a fresh Checkpointer and times T_w(N, p): from the first save until
the last is committed (so T_w / N is the time one checkpoint costs when N share the disk).
choose() keeps the N that fit — on storage, N in flight plus the `keep` committed ones the
store retains (N + keep ≤ S / m; PCcheck's N + 1 is keep = 1, our default keep = 2 stores
N + 2); in host memory, the chunk pipeline's floor, one staging chunk per writer of each
checkpoint in flight (N · p · chunk ≤ M): with M below N · m the checkpoints stream through
M of staging in chunks (PCcheck §3.3), the plan says so (staging_mb) and profile() should be
given the same staging_mb, so that T_w is measured with it — then takes N* = argmin T_w / N
with its best p, and the interval f* = ceil(T_w / (N* · q · t)) steps, so that writing costs
at most the fraction q of the step time t. It is an error when no measured N fits the limits.

PCcheck prices a checkpoint at T_w / N because its GPU trains while idle CPU cores write.
Where training itself keeps the CPU busy (CPU training, or few cores), the checkpoint's CPU
work (copies, CRCs, syscalls) is taken from training: profile() also measures that CPU time,
and choose(busy=...) prices a checkpoint at max(T_w, busy · CPU) / N. AutoInterval measures
busy while training, and then the real cost per checkpoint (feedback), which choose() takes
as cost_s.

T_w is profiled as a burst of N saves with nothing else running, not under training's load.
That is deliberate: a checkpoint's cost under load is measured where it matters, off the
step times of the run itself (AutoInterval's feedback), and the interval follows the larger
of the two. On the 2-core VM (idle T_w 0.63 s for N = 2-4) the plans priced a checkpoint at
142-243 ms of training and the overhead held within q + 1 point, median of 5 runs
(benchmarks/RESULTS.md, tuned_interval).
"""
from __future__ import annotations

import math
import os
import shutil
import statistics
import time
from dataclasses import asdict, dataclass, field

from ..errors import ConfigError


@dataclass
class Measurement:
    concurrency: int
    writers: int
    write_s: float  # T_w: the first save to the last commit of `concurrency` checkpoints
    cpu_s: float = 0.0  # CPU time the process spent in that while (every thread)

    @property
    def per_checkpoint_s(self) -> float:
        return self.write_s / self.concurrency

    def cost_s(self, busy: float) -> float:
        """Training time one checkpoint costs: its share of T_w (PCcheck), or, when training
        keeps the CPU `busy` (a fraction of all cores), the CPU the checkpoint takes from it."""
        return max(self.write_s, busy * self.cpu_s) / self.concurrency


@dataclass
class TunePlan:
    concurrency: int
    writers: int
    interval: int
    write_s: float
    state_bytes: int
    step_s: float
    overhead: float
    cost_s: float = 0.0  # training time one checkpoint is expected to cost (interval = cost / (q t))
    busy: float = 0.0  # the fraction of all cores training kept busy when the plan was made
    measurements: list = field(default_factory=list)
    excluded: dict = field(default_factory=dict)  # N -> why it was not allowed
    staging_mb: int | None = None  # set when host memory holds less than N checkpoints: chunked staging

    def to_dict(self) -> dict:
        return asdict(self)


def state_bytes(state) -> int:
    """Bytes of every tensor in a (nested dict/list) state."""
    import torch
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    return 0


def profile(state, directory: str, ns=(1, 2, 4), ps=(1, 2, 4), repeats: int = 1, progress=None,
            **checkpointer_kwargs) -> list[Measurement]:
    """T_w for every (N, p), measured with real checkpoints under `directory` (removed after);
    the median of `repeats` trials. progress(done, total): called after each trial."""
    out = []
    made = not os.path.isdir(directory)
    os.makedirs(directory, exist_ok=True)
    try:
        for n in ns:
            for p in ps:
                trials = []
                for _ in range(repeats):
                    trials.append(_trial(state, os.path.join(directory, f"tune-n{n}-p{p}"), n, p, checkpointer_kwargs))
                    if progress is not None:
                        progress(len(out) * repeats + len(trials), len(ns) * len(ps) * repeats)
                out.append(Measurement(n, p, statistics.median(t for t, _ in trials),
                                       statistics.median(c for _, c in trials)))
    finally:
        if made:
            shutil.rmtree(directory, ignore_errors=True)  # nothing of the trials is left behind
    return out


def cpu_seconds() -> float:
    """CPU time of this process so far, every thread (user + system), to the nanosecond
    (CLOCK_PROCESS_CPUTIME_ID: os.times() counts 10 ms ticks, and a 17 ms trial could read 0)."""
    return time.process_time()


def _trial(state, root: str, n: int, p: int, kwargs: dict) -> tuple[float, float]:
    """(wall, CPU) seconds from the first of n saves to the last commit."""
    from ..checkpointer import Checkpointer
    shutil.rmtree(root, ignore_errors=True)
    try:
        with Checkpointer(root, concurrency=n, writers=p, keep=n, distributed=False, **kwargs) as ck:
            t0, c0 = time.perf_counter(), cpu_seconds()
            for step in range(1, n + 1):
                ck.save(state, step=step)
            ck.wait()
            return time.perf_counter() - t0, cpu_seconds() - c0
    finally:
        shutil.rmtree(root, ignore_errors=True)


def choose(measurements: list[Measurement], state_bytes: int, step_s: float, overhead: float,
           host_bytes: int | None = None, storage_bytes: int | None = None, busy: float = 0.0,
           cost_s: float | None = None, keep: int = 2, chunk_bytes: int = 64 << 20) -> TunePlan:
    """N*, its best p, and f* from measurements under the memory and storage limits.

    keep: committed checkpoints the store retains (Checkpointer(keep=)); chunk_bytes: the
    staging chunk (Checkpointer(chunk_mb=)).

    busy: the fraction of all cores training keeps busy (0: the CPU is idle while the GPU
    trains — PCcheck's setting, where a checkpoint costs T_w / N). cost_s: a per-checkpoint
    cost measured while training (AutoInterval's feedback); the interval covers the larger."""
    if not measurements:
        raise ConfigError("tuning needs at least one measurement")
    if not (0 < overhead < 1):
        raise ConfigError(f"overhead is a fraction of the step time in (0, 1), got {overhead!r}")
    if step_s <= 0 or state_bytes <= 0:
        raise ConfigError("step_s and state_bytes must be positive")
    excluded = {}
    allowed = []
    for m in measurements:
        n, p = m.concurrency, m.writers
        if storage_bytes is not None and (n + keep) * state_bytes > storage_bytes:
            excluded[n] = (f"storage: {n} in flight + {keep} kept = {n + keep} checkpoints of {state_bytes} "
                           f"bytes exceed {storage_bytes}")
        elif host_bytes is not None and n * p * min(chunk_bytes, state_bytes) > host_bytes:
            excluded[n] = (f"host memory: {n} checkpoints x {p} writers need {n * p} staging chunks of "
                           f"{min(chunk_bytes, state_bytes)} bytes at least; {host_bytes} bytes given")
        else:
            allowed.append(m)
    if not allowed:
        raise ConfigError(f"no measured concurrency fits the limits: {excluded}")
    best = min(allowed, key=lambda m: (m.cost_s(busy), m.per_checkpoint_s, m.concurrency, m.writers))
    cost = max(best.cost_s(busy), cost_s or 0.0)
    interval = max(1, math.ceil(cost / (overhead * step_s) - 1e-9))
    chunked = host_bytes is not None and best.concurrency * state_bytes > host_bytes
    return TunePlan(best.concurrency, best.writers, interval, best.write_s, state_bytes, step_s, overhead,
                    cost, busy, [asdict(m) for m in measurements], {str(k): v for k, v in excluded.items()},
                    host_bytes >> 20 if chunked else None)
