"""interval="auto": the tuner (fastckpt.tune) driven by the training loop it serves.

    auto = AutoInterval(overhead=0.05)
    for step ...:
        auto.step_time(seconds)                  # every training step's wall time
        if auto.needs_tuning:                    # after `warmup_steps` steps: profile once
            auto.tune(state, "/ckpt/.tune")
        if auto.due(step): save(...)

Owns the plan's life: the first `warmup_steps` step times give t; tune() profiles N x p
with the real state on the real store and chooses N*, p*, f*; from then on the median of the
last `window` step times is watched, and when it drifts from the t the plan was made for by
more than `drift` (a fraction), the interval is chosen again from the same measurements with
the new t (writing a checkpoint costs what it cost; only the step changed). Every plan is
logged and, with `log_path`, saved as JSON (the latest plan, and every re-tune in `history`).
"""
from __future__ import annotations

import json
import logging
import statistics
from collections import deque
from typing import Optional

from .errors import ConfigError
from .fsutil import write_atomic
from .tune import Measurement, TunePlan, choose, profile, state_bytes

log = logging.getLogger("fastckpt")


class AutoInterval:
    def __init__(self, overhead: float = 0.05, drift: float = 0.2, warmup_steps: int = 5, window: int = 20,
                 ns=(1, 2, 4), ps=(1, 2, 4), repeats: int = 1, host_bytes: Optional[int] = None,
                 storage_bytes: Optional[int] = None, log_path: Optional[str] = None):
        if not 0 < overhead < 1:
            raise ConfigError(f"overhead is a fraction of the step time in (0, 1), got {overhead!r}")
        if drift <= 0 or warmup_steps < 1 or window < 1 or repeats < 1:
            raise ConfigError("drift > 0, warmup_steps >= 1, window >= 1 and repeats >= 1 are required")
        self.overhead, self.drift, self.warmup_steps = overhead, drift, warmup_steps
        self.ns, self.ps, self.repeats = tuple(ns), tuple(ps), repeats
        self.host_bytes, self.storage_bytes, self.log_path = host_bytes, storage_bytes, log_path
        self._times: deque = deque(maxlen=max(window, warmup_steps))
        self._measurements: list[Measurement] = []
        self._state_bytes = 0
        self.plan: Optional[TunePlan] = None
        self.history: list[dict] = []

    # -- what the loop tells it ---------------------------------------------------
    def step_time(self, seconds: float) -> None:
        self._times.append(seconds)
        if self.plan is not None:
            self._follow_drift()

    @property
    def step_s(self) -> float:
        return statistics.median(self._times)

    @property
    def needs_tuning(self) -> bool:
        return self.plan is None and len(self._times) >= self.warmup_steps

    # -- the plan -------------------------------------------------------------------
    def tune(self, state, directory: str, **checkpointer_kwargs) -> TunePlan:
        """Profiles here with `state`, then chooses for the step time seen so far."""
        self._state_bytes = state_bytes(state)
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

    def _choose(self, why: str) -> TunePlan:
        self.plan = choose(self._measurements, self._state_bytes, self.step_s, self.overhead,
                           host_bytes=self.host_bytes, storage_bytes=self.storage_bytes)
        self._times.clear()
        entry = dict(self.plan.to_dict(), event=why)
        self.history.append({k: entry[k] for k in ("event", "concurrency", "writers", "interval", "step_s")})
        log.info("fastckpt %s: concurrency=%d writers=%d interval=%d steps (T_w %.3f s, step %.1f ms, q %.0f%%)",
                 why, self.plan.concurrency, self.plan.writers, self.plan.interval, self.plan.write_s,
                 self.plan.step_s * 1e3, self.overhead * 100)
        if self.log_path:
            write_atomic(self.log_path, json.dumps(dict(entry, history=self.history), indent=1).encode())
        return self.plan
