"""The goodput replay (PCcheck §5.2.3): exact on hand-checkable cases, lost work within eq. 4,
a one-at-a-time writer stalls, traces are read strictly, and the CLI writes its plot."""
from __future__ import annotations

import json

import pytest

from fastckpt.errors import ConfigError
from fastckpt.tools.goodput import System, read_trace, replay, synthetic_trace, write_trace


def test_without_failures_goodput_is_the_step_rate_with_its_stalls():
    s = System("x", step_s=1.0, stall_s=0.5, write_s=0.1, concurrency=1)
    r = replay(s, 4, [], 100.0)
    assert r["iterations"] == 89  # 22 cycles of 4 steps + a 0.5 s stall = 99 s, then one more step ends at 100 s
    assert r["failures"] == 0 and r["lost_iterations"] == 0 and r["ideal"] == 1.0


def test_the_wait_for_the_oldest_checkpoint_starts_at_the_end_of_the_iteration():
    """PCcheck: a checkpoint interval takes max(T_w/N, f·t). With N=1, t=1 s, T_w=1.5 s, f=1 the
    compute of each iteration overlaps the write in flight: 1.5 s per iteration after the
    first, 200 iterations in 300 s (charging the wait from the iteration's start gave 120)."""
    r = replay(System("x", step_s=1.0, stall_s=0.0, write_s=1.5, concurrency=1), 1, [], 300.0)
    assert r["iterations"] == 1 + int((300.0 - 1.0) / 1.5) == 200
    # N=2 halves the write's share: max(1.5/2, 1) = 1 s per iteration, nothing waits
    assert replay(System("x", step_s=1.0, stall_s=0.0, write_s=1.5, concurrency=2), 1, [], 300.0)["iterations"] == 300
    # f=2, T_w=3: max(3/1, 2·1) = 3 s per 2 iterations after the first pair (ends at 2 s)
    r = replay(System("x", step_s=1.0, stall_s=0.0, write_s=3.0, concurrency=1), 2, [], 302.0)
    assert r["iterations"] == 2 + 2 * 100
    # a stall adds to each interval: max(f·t, T_w/N) + s = 1.5 + 0.5 = 2 s per iteration after the first
    r = replay(System("x", step_s=1.0, stall_s=0.5, write_s=1.5, concurrency=1), 1, [], 301.5)
    assert r["iterations"] == 1 + 150


def test_a_failure_rolls_back_to_the_newest_durable_checkpoint():
    s = System("x", step_s=1.0, stall_s=0.0, write_s=2.5, concurrency=2, load_s=3.0)
    r = replay(s, 5, [12.2], 30.0)
    # checkpoints issued at t=5 (durable 7.5) and t=10 (durable 12.5): at 12.2 only step 5 is durable
    assert r["failures"] == 1 and r["lost_iterations"] == 12 - 5
    assert r["iterations"] == 5 + int(30.0 - 12.2 - 3.0)  # resumed at 15.2 from step 5
    assert r["lost_iterations"] * s.step_s <= r["recovery_bound_s"]


def test_one_checkpoint_at_a_time_stalls_when_writes_are_slower_than_the_interval():
    slow = dict(step_s=1.0, stall_s=0.0, write_s=10.0, load_s=0.0)
    one = replay(System("N1", concurrency=1, **slow), 2, [], 200.0)
    four = replay(System("N4", concurrency=4, **slow), 2, [], 200.0)
    assert one["iterations"] < 0.3 * 200 and four["iterations"] > one["iterations"]


def test_lost_work_stays_within_the_recovery_bound_on_a_random_trace():
    trace = synthetic_trace(300, 20000, seed=3)
    for n in (1, 2, 4):
        s = System(f"N{n}", step_s=0.2, stall_s=0.01, write_s=1.5, concurrency=n, load_s=0.5)
        r = replay(s, 10, trace, 20000)
        assert r["failures"] == len(trace)
        assert r["lost_iterations"] / r["failures"] * s.step_s <= r["recovery_bound_s"]


def test_trace_files_are_read_strictly(tmp_path):
    p = tmp_path / "t.csv"
    write_trace(str(p), [5.0, 1.5], "two failures")
    assert read_trace(str(p)) == [1.5, 5.0]
    (tmp_path / "bad.csv").write_text("time_s\n3\nsoon\n")
    with pytest.raises(ConfigError, match="row 3: 'soon' is not a time in seconds"):
        read_trace(str(tmp_path / "bad.csv"))
    with pytest.raises(ConfigError, match="cannot read the failure trace"):
        read_trace(str(tmp_path / "missing.csv"))
    with pytest.raises(ConfigError, match="concurrency >= 1"):
        System.from_dict({"name": "x", "step_s": 1, "stall_s": 0, "write_s": 1, "concurrency": 0})
    with pytest.raises(ConfigError, match="bad system"):
        System.from_dict({"name": "x", "step_s": 1, "stall": 0, "write_s": 1})


def test_cli_replays_and_plots(tmp_path, capsys):
    from fastckpt.tools.cli import main
    systems = tmp_path / "s.json"
    systems.write_text(json.dumps([{"name": "fastckpt", "step_s": 0.15, "stall_s": 0.01, "write_s": 0.3,
                                    "concurrency": 2, "load_s": 0.2},
                                   {"name": "torch.save", "step_s": 0.15, "stall_s": 0.5, "write_s": 0.5}]))
    rc = main(["goodput", "--systems", str(systems), "--mtbf", "600", "--duration", "7200", "--make-trace",
               str(tmp_path / "trace.csv"), "--intervals", "1", "10", "100", "--png", str(tmp_path / "g.png"),
               "--json", str(tmp_path / "g.json")])
    assert rc == 0 and (tmp_path / "g.png").stat().st_size > 1000
    said = capsys.readouterr().out
    assert "peak fastckpt" in said
    assert f"wrote the plot to {tmp_path / 'g.png'}" in said and f"wrote the figures to {tmp_path / 'g.json'}" in said
    rows = json.loads((tmp_path / "g.json").read_text())["rows"]
    best = {n: max(r["goodput"] for r in rows if r["system"] == n) for n in ("fastckpt", "torch.save")}
    assert best["fastckpt"] > best["torch.save"]
    assert read_trace(str(tmp_path / "trace.csv"))
