"""benchmarks/report.py: REPORT.md is assembled from the sections the benchmarks recorded in
RESULTS.md and their plots; a benchmark that has not recorded is named missing, never filled in."""
from __future__ import annotations

import importlib.util
import os

from support.paths import ROOT


def _report_module():
    spec = importlib.util.spec_from_file_location("report", os.path.join(ROOT, "benchmarks", "report.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_report_takes_recorded_sections_and_names_missing_ones(tmp_path):
    report = _report_module()
    results = tmp_path / "RESULTS.md"
    results.write_text(
        "# Benchmark results\n\nprose that is not a section\n\n"
        "<!-- save_load:begin -->\n## save_load.py — 2026-11-22 10:00, vm\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
        "<!-- save_load:end -->\n\nreading of save_load\n\n"
        "<!-- goodput:begin -->\n## goodput.py — 2026-11-21 13:18, vm\n\ngoodput table\n\n"
        "Plot: `benchmarks/figures/goodput.png`, data: `benchmarks/figures/goodput.json`.\n<!-- goodput:end -->\n"
        "<!-- offload:begin -->\n## offload.py — vm; each part names its run\n\n### a — 2026-11-21 12:46\n\n"
        "### b — 2026-11-21 12:42\n<!-- offload:end -->\n")
    figures = tmp_path / "figures"
    figures.mkdir()
    (figures / "save_load.png").write_bytes(b"\x89PNG")
    (figures / "goodput.png").write_bytes(b"\x89PNG")

    text = report.build(str(results), str(figures))

    index = {line.split("](#")[1].split(")")[0]: line for line in text.splitlines() if line.startswith("| [")}
    assert set(index) == {name for name, _, _ in report.SECTIONS}
    assert index["save_load"].endswith("| 2026-11-22 10:00 |")
    assert index["goodput"].endswith("| 2026-11-21 13:18 |")
    assert index["offload"].endswith("| 2026-11-21 12:42 – 2026-11-21 12:46 |")  # dated by its parts
    for name in set(index) - {"save_load", "goodput", "offload"}:
        assert index[name].endswith("| MISSING |"), index[name]
        assert f"**Missing**: `{name}` has not recorded a section yet" in text
    # a section's own headings sit under the report's, its table is carried whole
    assert "### save_load.py — 2026-11-22 10:00, vm" in text and "| 1 | 2 |" in text
    assert "reading of save_load" not in text and "prose that is not a section" not in text
    # every recorded plot is shown once; the paths a section names are relative to the report
    assert text.count("![Save and load throughput vs the physical bound](figures/save_load.png)") == 1
    assert text.count("![Goodput vs interval](figures/goodput.png)") == 1
    assert "Plot: `figures/goodput.png`" in text and "benchmarks/figures" not in text
