"""The reliability campaign's CI-sized run: tests/campaign/run.py, one part per test, in a fresh
process (its victims are forked from a parent that never ran a thread). The long run is
`python tests/campaign/run.py --many`, or `python benchmarks/reliability.py --many` to record
its figures in benchmarks/RESULTS.md."""
from __future__ import annotations

import json
import os
import sys

import pytest

from support import warm
from support.paths import ROOT

PARTS = ("kills", "corruptions", "faults", "ranks", "hostile", "soak")


@pytest.mark.parametrize("part", PARTS)
def test_campaign_part(tmp_path, part):
    out = tmp_path / "res.json"
    proc = warm.run([sys.executable, os.path.join(ROOT, "tests", "campaign", "run.py"), "--parts", part,
                     "--json", str(out)], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())["parts"][part]
    if "skipped" in r:
        pytest.skip(r["skipped"])
    assert r["ok"], proc.stdout[-4000:]
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    if part == "kills":
        assert r["kills"] == 24 and r["unrecoverable"] == 0
    elif part == "corruptions":
        assert r["detected"] == r["corruptions"] == 110
    elif part == "hostile":
        assert r["rejected"] == r["cases"] >= 50 and r["code_executed"] == 0
    elif part == "faults":
        assert r["passed"] == r["runs"] == 12
