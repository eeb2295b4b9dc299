"""The tuner (PCcheck §3.4): limits exclude N, N* minimises T_w/N, f* = ceil(T_w / (N*·q·t)),
and profiling measures real checkpoints."""
from __future__ import annotations

import json
import math
import os

import pytest
import torch

from fastckpt.errors import ConfigError
from fastckpt.tune.profile import Measurement, choose, profile

GIB = 1 << 30


def test_chooses_the_lowest_time_per_checkpoint_and_the_interval_from_it():
    ms = [Measurement(1, 4, 2.0), Measurement(2, 4, 3.0), Measurement(4, 4, 8.0), Measurement(2, 1, 3.6)]
    plan = choose(ms, state_bytes=GIB, step_s=0.5, overhead=0.05)
    assert (plan.concurrency, plan.writers) == (2, 4)  # 1.5 s per checkpoint beats 2.0 and 2.0
    assert plan.interval == 60  # ceil(3.0 / (2 * 0.05 * 0.5))


def test_storage_and_host_memory_limits_exclude_concurrency():
    ms = [Measurement(1, 4, 2.0), Measurement(2, 4, 3.0), Measurement(4, 4, 4.0)]
    # the store keeps `keep` committed checkpoints besides the N in flight: N + keep <= S/m
    plan = choose(ms, state_bytes=GIB, step_s=1.0, overhead=0.1, storage_bytes=4 * GIB)
    assert plan.concurrency == 2 and "2 kept = 6 checkpoints" in plan.excluded["4"]  # keep=2: N <= 2
    plan = choose(ms, state_bytes=GIB, step_s=1.0, overhead=0.1, storage_bytes=4 * GIB, keep=1)
    assert plan.concurrency == 2  # N=4 needs 5 (PCcheck's N + 1) > 4
    plan = choose(ms, state_bytes=GIB, step_s=1.0, overhead=0.1, storage_bytes=5 * GIB, keep=1)
    assert plan.concurrency == 4
    # host memory below N checkpoints: the checkpoints stream through it in chunks (PCcheck)
    plan = choose(ms, state_bytes=GIB, step_s=1.0, overhead=0.1, host_bytes=int(1.5 * GIB))
    assert plan.concurrency == 4 and plan.staging_mb == 1536 and not plan.excluded
    plan = choose(ms, state_bytes=GIB, step_s=1.0, overhead=0.1, host_bytes=8 * GIB)
    assert plan.concurrency == 4 and plan.staging_mb is None  # room for N whole copies
    # ... down to the pipeline's floor: one chunk per writer of each checkpoint in flight
    plan = choose(ms, state_bytes=GIB, step_s=1.0, overhead=0.1, host_bytes=600 << 20, chunk_bytes=64 << 20)
    assert plan.concurrency == 2 and "16 staging chunks" in plan.excluded["4"]  # 4 x 4 x 64 MiB > 600 MiB
    with pytest.raises(ConfigError, match="no measured concurrency fits"):
        choose(ms, state_bytes=GIB, step_s=1.0, overhead=0.1, storage_bytes=2 * GIB)
    with pytest.raises(ConfigError, match="overhead is a fraction"):
        choose(ms, state_bytes=GIB, step_s=1.0, overhead=5)


def test_profile_times_real_checkpoints(tmp_path):
    state = {"w": torch.randn(1 << 20)}
    ms = profile(state, str(tmp_path / "tune"), ns=(1, 2), ps=(1, 2))
    assert [(m.concurrency, m.writers) for m in ms] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert all(m.write_s > 0 for m in ms)
    assert not os.path.exists(tmp_path / "tune")  # the trial checkpoints are gone, and the folder made for them
    plan = choose(ms, state_bytes=4 << 20, step_s=0.1, overhead=0.05)
    assert plan.interval >= 1 and plan.concurrency in (1, 2)


def test_cli_prints_and_saves_the_plan(tmp_path, capsys):
    from fastckpt.tools.cli import main
    rc = main(["tune", str(tmp_path / "t"), "--step-s", "0.1", "--state-gb", "0.004", "--ns", "1", "2",
               "--ps", "1", "--repeats", "1", "--storage-gb", "0.02", "--out", str(tmp_path / "plan.json")])
    assert rc == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["concurrency"] in (1, 2) and plan["interval"] >= 1 and len(plan["measurements"]) == 2
    assert "chosen: concurrency=" in capsys.readouterr().out


def test_auto_interval_tunes_after_warmup_and_follows_drift(tmp_path):
    from fastckpt.tune.auto_interval import AutoInterval
    auto = AutoInterval(overhead=0.1, drift=0.2, warmup_steps=3, window=4, ns=(1, 2), ps=(1,),
                        log_path=str(tmp_path / "tune.json"))
    state = {"w": torch.randn(1 << 20)}
    for _ in range(3):
        assert not auto.needs_tuning and not auto.due(10)
        auto.step_time(0.001)  # steps far shorter than a durable 4 MiB write: an interval of 2 steps or more
    assert auto.needs_tuning
    plan = auto.tune(state, str(tmp_path / "t"))
    assert plan.interval >= 2, plan  # (at 0.1 s a step, a fast disk gave 1: every step due, nothing to tell apart)
    assert plan.step_s == pytest.approx(0.001) and auto.due(plan.interval) and not auto.due(plan.interval + 1)
    first = plan.interval
    for _ in range(4):
        auto.step_time(0.004)  # the step got 4x slower: a checkpoint may come 4x less often (in steps)
    assert auto.plan.step_s == pytest.approx(0.004)
    p = auto.plan
    assert auto.interval == max(1, math.ceil(p.write_s / (p.concurrency * 0.1 * 0.004))) and auto.interval <= first
    saved = json.loads((tmp_path / "tune.json").read_text())
    assert [h["event"][:8] for h in saved["history"]] == ["tuned", "re-tuned"]


def test_lightning_every_n_train_steps_auto(tmp_path, caplog):
    import logging
    import time

    import lightning as L
    from lightning_fastckpt import FastCheckpointIO, TunedModelCheckpoint
    from workers.lit_app import TinyModule, loader, trainer

    class SlowStep(L.Callback):  # a 30 ms step, so a checkpoint of this small model is due every few steps
        def on_train_batch_end(self, *a):
            time.sleep(0.03)

    io = FastCheckpointIO(concurrency=3, writers=4)
    cb = TunedModelCheckpoint(dirpath=str(tmp_path / "ck"), every_n_train_steps="auto", overhead=0.5, drift=100,
                              warmup_steps=3, ns=(1, 2), ps=(1, 2), save_top_k=-1)
    torch.manual_seed(0)
    with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
        trainer(io, [SlowStep(), cb], max_steps=30).fit(TinyModule(width=64, big=512), loader(n=30 * 16), None)
    told = [r.getMessage() for r in caplog.records if r.name.startswith("lightning") and "fastckpt tuned" in r.getMessage()]
    assert told and "a checkpoint every" in told[0]  # where Lightning shows its own messages
    plan = json.loads((tmp_path / "ck" / "fastckpt-tune.json").read_text())
    assert plan["concurrency"] in (1, 2) and plan["writers"] in (1, 2) and plan["interval"] == cb.auto.interval
    opened_with = io.named.settings  # what its next Checkpointer opens with
    assert (opened_with["concurrency"], opened_with["writers"]) == (plan["concurrency"], plan["writers"])
    steps = sorted(int(f.split("step=")[1].split(".")[0]) for f in os.listdir(tmp_path / "ck") if "step=" in f)
    intervals = {h["interval"] for h in plan["history"]}  # the feedback may have re-chosen it mid-run
    assert steps and min(steps) > 3 and all(any(s % i == 0 for i in intervals) for s in steps)
    assert steps, f"interval {plan['interval']} left no checkpoint in 30 steps"
    assert not os.path.exists(tmp_path / "ck" / ".fastckpt-tune")  # the trial checkpoints are gone, folder too


def test_a_busy_cpu_prices_a_checkpoint_by_the_cpu_it_takes():
    ms = [Measurement(1, 4, 1.0, cpu_s=0.8), Measurement(4, 4, 2.0, cpu_s=3.2)]
    idle = choose(ms, state_bytes=GIB, step_s=0.1, overhead=0.1)
    assert (idle.concurrency, idle.interval) == (4, 50)  # PCcheck: T_w/N = 0.5 s
    busy = choose(ms, state_bytes=GIB, step_s=0.1, overhead=0.1, busy=1.0)
    assert busy.cost_s == pytest.approx(0.8) and busy.interval == 80  # the CPU a checkpoint takes: 0.8 s
    assert choose(ms, state_bytes=GIB, step_s=0.1, overhead=0.1, cost_s=1.5).interval == 150


def test_profile_measures_the_cpu_of_the_checkpoints(tmp_path):
    (m,) = profile({"w": torch.randn(4 << 20)}, str(tmp_path / "tune"), ns=(1,), ps=(2,))
    assert 0 < m.cpu_s < 10 * m.write_s  # 16 MiB copied, CRC'd and written takes some CPU


def _tuned_on_100ms_steps(write_s: float, log_path=None):
    """An AutoInterval (q = 10 %) tuned on three 100 ms steps and one measured checkpoint of
    write_s, then fed `train(extra_s, steps)`: steps that cost extra_s more when they checkpoint."""
    from fastckpt.tune.auto_interval import AutoInterval
    auto = AutoInterval(overhead=0.1, warmup_steps=3, window=50, feedback_intervals=2, log_path=log_path)
    auto._measurements, auto._state_bytes = [Measurement(1, 1, write_s, cpu_s=0.0)], GIB
    for _ in range(3):
        auto.step_time(0.1)
    auto._choose("tuned")

    def train(extra_s: float, steps: int) -> None:
        for step in range(1, steps):
            ckpt = step % auto.interval == 0
            auto.step_time(0.1 + (extra_s if ckpt else 0.0), checkpointing=ckpt)
    return auto, train


def test_feedback_raises_the_interval_to_the_cost_training_measures(tmp_path):
    """Step times where every checkpoint step costs 60 ms more than the 100 ms step: the
    measured cost replaces the model's (T_w/N = 20 ms), so the overhead comes back to q."""
    auto, train = _tuned_on_100ms_steps(0.02)
    assert auto.interval == 2  # 0.02 / (0.1 * 0.1)
    train(0.06, 200)
    assert auto.interval == 6  # ceil(0.06 / (0.1 * 0.1))
    assert auto.measured_overhead == pytest.approx(0.1, abs=0.01)
    assert any(h["event"].startswith("re-tuned: a checkpoint cost 60 ms") for h in auto.history)


def test_feedback_under_budget_keeps_the_model_interval_and_a_short_history(tmp_path):
    """Checkpoints that cost training less than the model priced: the interval stays at the
    model's (never below it) and a long run adds no history entry per feedback round."""
    auto, train = _tuned_on_100ms_steps(0.05, log_path=str(tmp_path / "plan.json"))
    assert auto.interval == 5  # 0.05 / (0.1 * 0.1)
    train(0.001, 5000)
    assert auto.measured_overhead == pytest.approx(0.002, abs=0.001)  # the feedback did look
    assert auto.interval == 5 and len(auto.history) == 1
    assert len(json.loads((tmp_path / "plan.json").read_text())["history"]) == 1


def test_feedback_when_every_step_has_a_checkpoint_in_flight(tmp_path):
    """On a loaded machine every step after tuning can have a checkpoint in flight: there is no
    quiet step to time. The step time is then the plan's (it crashed: median of no data)."""
    auto, _ = _tuned_on_100ms_steps(0.02)
    for _ in range(200):
        auto.step_time(0.3, checkpointing=True)
    assert auto.step_s == pytest.approx(0.1) and auto.interval > 2  # the cost feedback still acted


def test_profile_reports_progress_after_each_trial(tmp_path):
    """`fastckpt tune` was silent for a minute: its bar follows these calls."""
    seen = []
    profile({"w": torch.randn(1 << 16)}, str(tmp_path / "t"), ns=(1, 2), ps=(1,), repeats=2,
            progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
