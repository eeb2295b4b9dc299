"""benchmarks/helpers/results.py: RESULTS.md is the one report. A benchmark's section goes between
its markers, and the index at the top is rebuilt from the sections recorded. A benchmark that has
not recorded is named MISSING, never filled in."""
from __future__ import annotations

import importlib.util
import os

from support.paths import BENCHMARKS


def _results_module():
    spec = importlib.util.spec_from_file_location("results", os.path.join(BENCHMARKS, "helpers", "results.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _index(text: str) -> dict[str, str]:
    rows = [line for line in text.split("<!-- index:end -->")[0].splitlines() if line.startswith("| `") or
            line.startswith("| [`")]
    return {row.split("`")[1][:-3]: row for row in rows}


def test_sections_replace_their_own_and_the_index_follows(tmp_path):
    results = _results_module()
    path = str(tmp_path / "RESULTS.md")
    with open(path, "w") as f:
        f.write("# Benchmark results\n\nprose that stays\n")
    results.write_section("save_load", "## save_load.py — 2026-11-22 10:00, vm\n\n| a | b |\n|---|---|\n| 1 | 2 |", path)
    results.write_section("offload", "## offload.py — vm; each part names its run\n\n### a — 2026-11-21 12:46\n\n"
                                     "### b — 2026-11-21 12:42", path)
    results.write_section("save_load", "## save_load.py — 2026-11-23 09:30, vm\n\n| a | b |\n|---|---|\n| 3 | 4 |", path)
    text = open(path).read()

    assert text.startswith("# Benchmark results\n\n<!-- index:begin -->") and "prose that stays" in text
    assert text.count("<!-- index:begin -->") == 1 and text.count("<!-- save_load:begin -->") == 1
    assert "| 3 | 4 |" in text and "| 1 | 2 |" not in text  # re-recorded in place
    index = _index(text)
    assert set(index) == {name for name, _ in results.SECTIONS}
    assert index["save_load"].startswith("| [`save_load.py`](#save_load)")
    assert index["save_load"].endswith("| 2026-11-23 09:30 |")
    assert index["offload"].endswith("| 2026-11-21 12:42 – 2026-11-21 12:46 |")  # dated by its parts
    for name in set(index) - {"save_load", "offload"}:
        assert index[name].endswith("| MISSING |") and "](#" not in index[name], index[name]
    assert text.count('<a id="save_load"></a>') == 1  # the link target, once


def test_keep_writes_json_out_of_the_tree_and_the_plot_beside_the_section_which_shows_it(tmp_path, monkeypatch):
    results = _results_module()
    path = tmp_path / "RESULTS.md"
    monkeypatch.setattr(results, "RESULTS", str(path))
    monkeypatch.setattr(results, "FIGURES", str(tmp_path / "figures"))
    monkeypatch.setattr(results.write_section, "__defaults__", (str(path),))
    out = tmp_path / "out"
    results.keep("goodput", str(out), {"x": 1}, "## goodput.py — 2026-11-24 15:42, vm\n\ntable",
                 lambda res, png: open(png, "wb").write(b"\x89PNG"), publish=True)
    assert (out / "goodput.json").read_text().strip().startswith("{") and (out / "goodput.png").exists()
    assert (tmp_path / "figures" / "goodput.png").read_bytes() == b"\x89PNG"  # committed beside RESULTS.md
    text = path.read_text()
    assert "![goodput](figures/goodput.png)" in text and "goodput.json` (generated, not kept in git)" in text
    results.keep("offload", str(out), {"x": 1}, "## offload.py — 2026-11-24 15:42, vm\n\ntable",
                 lambda res, png: open(png, "wb").write(b"\x89PNG"), publish=False)
    assert not (tmp_path / "figures" / "offload.png").exists()  # a run not recorded keeps no picture