"""benchmarks/gpu_overhead.py runs on CPU with a tiny model, every contender, so it never rots;
its figures are computed as documented from the step times."""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

from support.paths import ROOT
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import gpu_overhead  # noqa: E402


def test_figures_from_step_times_by_hand():
    a = SimpleNamespace(quiet=4)
    # baseline 10 ms; k=2; the first interval loses 100 ms, each later checkpoint 6 ms
    times = [0.010] * 4 + [0.110, 0.010] + [0.014, 0.012] * 3
    got = gpu_overhead.metrics(a, {"times": times, "calls": [0.05, 0.002, 0.004, 0.003], "drain": 0.5}, 2)
    assert abs(got["base_ms"] - 10) < 1e-9
    assert abs(got["first_s"] - 0.100) < 1e-9
    assert abs(got["stall_ms"] - 6) < 1e-9              # 18 ms lost over 3 steady checkpoints
    assert abs(got["steady_pct"] - 30) < 1e-9           # 78 ms where 60 ms is the baseline
    assert abs(got["whole_pct"] - (198 / 80 - 1) * 100) < 1e-9
    assert got["save_first_ms"] == 50 and abs(got["save_ms"] - 3) < 1e-9 and got["drain_s"] == 0.5


def test_intervals_around_the_disks_pace():
    args = SimpleNamespace(ks=None, pace_only=False)
    assert gpu_overhead.intervals(args, {"base_ms": 40.0}, 2.3) == [29, 58, 116]
    assert gpu_overhead.intervals(args, {"base_ms": 40.0}, 0.001) == [1, 2]
    args.pace_only = True  # make gpu-check's short run: where the disk just keeps up, alone
    assert gpu_overhead.intervals(args, {"base_ms": 40.0}, 2.3) == [58]


def test_every_contender_runs_on_cpu(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "gpu_overhead.py"), "--d-model", "32", "--layers", "1",
           "--ds-layers", "1", "--heads", "2", "--vocab", "128", "--seq", "8", "--batch", "2", "--ks", "2",
           "--intervals", "2", "--warmup", "1", "--quiet", "3", "--runs", "1", "--child-timeout", "300",
           "--no-results", "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=str(tmp_path))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    res = json.load(open(out / "gpu_overhead.json"))
    rows = {r["contender"]: r for r in res["rows"]}
    assert set(rows) == set(gpu_overhead.contenders.ALL)
    for name, r in rows.items():
        assert not r["errors"], (name, r["errors"])
        assert r["checked"], name
        assert len(r["runs"][0]["calls"]) == (0 if name == "none" else 2), name
        assert len(r["runs"][0]["times"]) == 3 + 2 * 2, name  # quiet + measured steps
    assert res["bounds"]["bytes"] > 0 and res["bounds"]["direct_write_s"] > 0
    assert (out / "gpu_overhead.png").exists()
    assert "| 2 | fast_c |" in run.stdout
