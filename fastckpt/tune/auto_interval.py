"""interval="auto": the tuner (fastckpt.tune.profile) driven by the training loop it serves.

    auto = AutoInterval(overhead=0.05)
    for step ...:
        auto.step_time(seconds, checkpointing)   # every step's wall time; was a checkpoint in flight?
        if auto.needs_tuning:                    # after `warmup_steps` steps: profile once
            auto.tune(state, "/ckpt/.tune")
        if auto.due(step): save(...)

Owns the plan's life: the first `warmup_steps` step times give t, and the CPU time the
process spent in them gives `busy` (the fraction of all cores training keeps busy); tune()
profiles N x p with the real state on the real store and chooses N*, p*, f* (pricing a
checkpoint at max(T_w, busy x its CPU time) / N, see fastckpt.tune.profile). From then on:
- drift: the median of the last `window` quiet step times is watched, and when it drifts from the t
  the plan was made for by more than `drift` (a fraction), the interval is chosen again from
  the same measurements with the new t;
- feedback: every `feedback_intervals` intervals (at least 20 steps), the cost one checkpoint
  really had is read off the step times — (mean step - quiet step) x interval, the quiet step
  being the median of the steps with no checkpoint saved or in flight (the faces say which) —
  and when it makes the overhead exceed q by a tenth (or fall under half of q), the interval
  is chosen again with that measured cost (never below the model's interval). The model
  cannot know how much a checkpoint's copies and writes slow *this* training; the loop can.
Every plan is logged and, with `log_path`, saved as JSON (the latest plan, and every re-tune
in `history`).
"""
from __future__ import annotations

import json
import logging
import math
import os
import statistics
from collections import deque
from typing import Optional

from ..errors import ConfigError
from ..fsutil import write_atomic
from .profile import Measurement, TunePlan, choose, cpu_seconds, profile, state_bytes

log = logging.getLogger("fastckpt")


class AutoInterval:
    def __init__(self, overhead: float = 0.05, drift: float = 0.2, warmup_steps: int = 5, window: int = 20,
                 ns=(1, 2, 4), ps=(1, 2, 4), repeats: int = 1, host_bytes: Optional[int] = None,
                 storage_bytes: Optional[int] = None, log_path: Optional[str] = None,
                 feedback_intervals: int = 2):
        if not 0 < overhead < 1:
            raise ConfigError(f"overhead is a fraction of the step time in (0, 1), got {overhead!r}")
        if drift <= 0 or warmup_steps < 1 or window < 1 or repeats < 1 or feedback_intervals < 1:
            raise ConfigError("drift > 0, warmup_steps >= 1, window >= 1, repeats >= 1 and "
                              "feedback_intervals >= 1 are required")
        self.overhead, self.drift, self.warmup_steps = overhead, drift, warmup_steps
        self.ns, self.ps, self.repeats = tuple(ns), tuple(ps), repeats
        self.host_bytes, self.storage_bytes, self.log_path = host_bytes, storage_bytes, log_path
        self.feedback_intervals = feedback_intervals
        self._times: deque = deque(maxlen=max(window, warmup_steps))
        self._busy: deque = deque(maxlen=max(window, warmup_steps))
        self._cpu_at: Optional[float] = None
        self._since_plan: list[float] = []  # step times under the current plan (feedback)
        self._cost_s: Optional[float] = None  # measured cost of one checkpoint, once known
        self.measured_overhead: Optional[float] = None
        self.steps_timed = 0
        self._measurements: list[Measurement] = []
        self._state_bytes = 0
        self.plan: Optional[TunePlan] = None
        self.history: list[dict] = []

    # -- what the loop tells it ---------------------------------------------------
    def step_time(self, seconds: float, checkpointing: bool = False) -> None:
        """One training step's wall time; checkpointing: a checkpoint was saved or in flight in it
        (such steps feed the cost feedback, not the step time t)."""
        self.steps_timed += 1
        if not checkpointing:
            self._times.append(seconds)
        cpu = cpu_seconds()
        if self._cpu_at is not None and self.plan is None and seconds > 0:  # quiet steps only
            self._busy.append(min(1.0, (cpu - self._cpu_at) / (seconds * _cores())))
        self._cpu_at = cpu
        if self.plan is not None:
            self._since_plan.append((seconds, checkpointing))
            self._follow_drift()
            self._follow_cost()

    @property
    def busy(self) -> float:
        return statistics.median(self._busy) if self._busy else 0.0

    @property
    def step_s(self) -> float:
        """The median quiet step (no checkpoint in it); while none has been seen since the
        last plan (every step had one in flight), the plan's."""
        if self._times or self.plan is None:
            return statistics.median(self._times)
        return self.plan.step_s

    @property
    def needs_tuning(self) -> bool:
        return self.plan is None and len(self._times) >= self.warmup_steps

    # -- the plan -------------------------------------------------------------------
    def tune(self, state, directory: str, **checkpointer_kwargs) -> TunePlan:
        """Profiles here with `state`, then chooses for the step time seen so far."""
        self._state_bytes = state_bytes(state)
        if self.host_bytes is not None:  # T_w measured with the staging the plan may run with
            checkpointer_kwargs.setdefault("staging_mb", max(1, self.host_bytes >> 20))
        self._measurements = profile(state, directory, self.ns, self.ps, self.repeats, **checkpointer_kwargs)
        return self._choose("tuned")

    @property
    def interval(self) -> Optional[int]:
        return self.plan.interval if self.plan is not None else None

    def due(self, step: int) -> bool:
        return self.plan is not None and step > 0 and step % self.plan.interval == 0

    def _follow_drift(self) -> None:
        if len(self._times) < self._times.maxlen:
            return
        if abs(self.step_s - self.plan.step_s) > self.drift * self.plan.step_s:
            before = self.plan.interval
            self._choose(f"re-tuned: step time {self.plan.step_s * 1e3:.1f} -> {self.step_s * 1e3:.1f} ms "
                         f"(drift over {self.drift:.0%})")
            log.info("fastckpt: interval %d -> %d steps", before, self.plan.interval)

    def _follow_cost(self) -> None:
        f = self.plan.interval
        span = f * max(self.feedback_intervals, math.ceil(20 / f))  # whole intervals: as many checkpoints as f's
        if len(self._since_plan) < span:
            return
        recent = self._since_plan[-span:]
        quiet = [x for x, busy in recent if not busy]
        t = statistics.median(quiet) if len(quiet) >= 3 else self.plan.step_s
        cost = (statistics.fmean(x for x, _ in recent) - t) * f  # span / f checkpoints made the excess
        self.measured_overhead = cost / (f * t)
        if self.overhead / 2 <= self.measured_overhead <= self.overhead * 1.1:
            self._since_plan.clear()
            return
        self._cost_s = max(0.0, cost)
        plan = self._plan()
        self._since_plan.clear()
        if plan.interval == f:  # the model's interval is the floor: already there, nothing to record
            return
        self._adopt(plan, f"re-tuned: a checkpoint cost {cost * 1e3:.0f} ms of training "
                          f"({self.measured_overhead:.1%} at every {f} steps, budget {self.overhead:.0%})")
        log.info("fastckpt: interval %d -> %d steps", f, self.plan.interval)

    def _plan(self) -> TunePlan:
        return choose(self._measurements, self._state_bytes, self.step_s, self.overhead,
                      host_bytes=self.host_bytes, storage_bytes=self.storage_bytes, busy=self.busy,
                      cost_s=self._cost_s)

    def _choose(self, why: str) -> TunePlan:
        return self._adopt(self._plan(), why)

    def _adopt(self, plan: TunePlan, why: str) -> TunePlan:
        self.plan = plan
        self._times.clear()
        self._since_plan.clear()
        entry = dict(self.plan.to_dict(), event=why, steps_timed=self.steps_timed)
        self.history.append({k: entry[k] for k in ("event", "steps_timed", "concurrency", "writers", "interval",
                                                    "step_s", "cost_s", "busy")})
        log.info("fastckpt %s: concurrency=%d writers=%d interval=%d steps (T_w %.3f s, step %.1f ms, q %.0f%%)",
                 why, self.plan.concurrency, self.plan.writers, self.plan.interval, self.plan.write_s,
                 self.plan.step_s * 1e3, self.overhead * 100)
        if self.log_path:
            write_atomic(self.log_path, json.dumps(dict(entry, history=self.history), indent=1).encode())
        return self.plan


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
