"""The tuner (PCcheck §3.4): limits exclude N, N* minimises T_w/N, f* = ceil(T_w / (N*·q·t)),
and profiling measures real checkpoints."""
from __future__ import annotations

import os

import pytest
import torch

from fastckpt.errors import ConfigError
from fastckpt.tune import Measurement, choose, profile

GIB = 1 << 30


def test_chooses_the_lowest_time_per_checkpoint_and_the_interval_from_it():
    ms = [Measurement(1, 4, 2.0), Measurement(2, 4, 3.0), Measurement(4, 4, 8.0), Measurement(2, 1, 3.6)]
    plan = choose(ms, state_bytes=GIB, step_s=0.5, overhead=0.05)
    assert (plan.concurrency, plan.writers) == (2, 4)  # 1.5 s per checkpoint beats 2.0 and 2.0
    assert plan.interval == 60  # ceil(3.0 / (2 * 0.05 * 0.5))


def test_storage_and_host_memory_limits_exclude_concurrency():
    ms = [Measurement(1, 4, 2.0), Measurement(2, 4, 3.0), Measurement(4, 4, 4.0)]
    plan = choose(ms, state_bytes=GIB, step_s=1.0, overhead=0.1, storage_bytes=3 * GIB)
    assert plan.concurrency == 2 and "storage" in plan.excluded["4"]  # N <= S/m - 1 = 2
    plan = choose(ms, state_bytes=GIB, step_s=1.0, overhead=0.1, host_bytes=int(1.5 * GIB))
    assert plan.concurrency == 1 and "host memory" in plan.excluded["2"]
    with pytest.raises(ConfigError, match="no measured concurrency fits"):
        choose(ms, state_bytes=GIB, step_s=1.0, overhead=0.1, storage_bytes=GIB)
    with pytest.raises(ConfigError, match="overhead is a fraction"):
        choose(ms, state_bytes=GIB, step_s=1.0, overhead=5)


def test_profile_times_real_checkpoints(tmp_path):
    state = {"w": torch.randn(1 << 20)}
    ms = profile(state, str(tmp_path / "tune"), ns=(1, 2), ps=(1, 2))
    assert [(m.concurrency, m.writers) for m in ms] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert all(m.write_s > 0 for m in ms)
    assert os.listdir(tmp_path / "tune") == []  # the trial checkpoints are gone
    plan = choose(ms, state_bytes=4 << 20, step_s=0.1, overhead=0.05)
    assert plan.interval >= 1 and plan.concurrency in (1, 2)


def test_cli_prints_and_saves_the_plan(tmp_path, capsys):
    import json
    from fastckpt.cli import main
    rc = main(["tune", str(tmp_path / "t"), "--step-s", "0.1", "--state-gb", "0.004", "--ns", "1", "2",
               "--ps", "1", "--repeats", "1", "--storage-gb", "0.01", "--out", str(tmp_path / "plan.json")])
    assert rc == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["concurrency"] in (1, 2) and plan["interval"] >= 1 and len(plan["measurements"]) == 2
    assert "chosen: concurrency=" in capsys.readouterr().out
