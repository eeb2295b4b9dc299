"""`make gpu-check` (the gpu tests, benchmarks/gpu_profile.py, then benchmarks/gpu_overhead.py with
every contender) runs on CPU with a tiny model, so it never rots;
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


def test_make_gpu_check_runs_end_to_end_on_cpu(tmp_path):
    """`make gpu-check`, the first command a lent GPU runs, as it runs there but on this CPU: every
    gpu test collected and the first of two files in its own process (each SKIPs here), then every
    contender of gpu_overhead.py with a tiny model; logs and JSON under $OUT. A typo in it costs
    no device minute."""
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), JOBS="2", SCRATCH=str(tmp_path / "scratch"))
    run = subprocess.run(["make", "-s", "gpu-check", f"PYGPU={sys.executable}"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "gpu-check: OK" in run.stdout
    assert "device none" in (out / "env.txt").read_text()
    lines = (out / "gpu-tests.txt").read_text().splitlines()
    tests = [line for line in lines if "::" in line]
    ran = [line for line in tests if not line.startswith("SAMPLED")]
    files = {line.split()[-1].split("::")[0] for line in tests}
    assert len(tests) >= 80 and len(ran) == 2 and len(files) > 2, (len(tests), len(ran), len(files))
    assert all(line.startswith("SKIP") for line in ran), ran[:5]
    assert f"PASS 0 FAIL 0 HANG 0 SKIP {len(ran)} NOTRUN 0" in lines
    res = json.load(open(out / "bench" / "gpu_overhead.json"))
    rows = {r["contender"]: r for r in res["rows"]}
    assert set(rows) == set(gpu_overhead.contenders.ALL)
    for name, r in rows.items():
        assert not r["errors"], (name, r["errors"])
        assert r["checked"], name
        assert len(r["runs"][0]["calls"]) == (0 if name == "none" else 2), name
        assert len(r["runs"][0]["times"]) == 3 + 2 * 2, name  # quiet + measured steps
    assert res["bounds"]["bytes"] > 0 and res["bounds"]["direct_write_s"] > 0
    assert (out / "bench" / "gpu_overhead.png").exists()
    bench = (out / "bench.txt").read_text()
    assert "| 2 | fast_c |" in bench and "Where a fastckpt save went" in bench
    for name in ("fast_c", "fast_g", "fast_d", "l_fast", "l_layerwise", "ds_fast"):  # where their saves went
        assert {"save", "put", "commit", "durable_at"} <= set(rows[name]["phases"]), name
    profile = (out / "profile" / "profile.md").read_text()  # torch.profiler over saves of c and g
    assert "## strategy c:" in profile and "## strategy g:" in profile and "Top 20 by" in profile
    assert (out / "profile" / "profile-c.json").stat().st_size > 0 and (out / "profile" / "profile-g.txt").exists()
    assert not (tmp_path / "scratch").exists()  # the checkpoints and the write bound's file are gone
