"""Keeps one benchmark's results: its JSON and plot, and its generated section of benchmarks/RESULTS.md."""
from __future__ import annotations

import json
import os
import shutil
from typing import Callable

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # benchmarks/


def write_section(name: str, text: str) -> None:
    path = os.path.join(HERE, "RESULTS.md")
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    old = open(path).read() if os.path.exists(path) else "# Benchmark results\n"
    block = f"{begin}\n{text}\n{end}"
    if begin in old and end in old:
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = old.rstrip() + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(new)


def keep(name: str, out_dir: str, res: dict, text: str, plot: Callable[[dict, str], None], publish: bool) -> None:
    """Writes NAME.json and NAME.png into out_dir; with `publish`, copies both to
    benchmarks/figures (the figures RESULTS.md quotes are kept with it) and puts `text`
    into RESULTS.md."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(res, f, indent=1)
    plot(res, os.path.join(out_dir, f"{name}.png"))
    if not publish:
        return
    figures = os.path.join(HERE, "figures")
    os.makedirs(figures, exist_ok=True)
    for ext in ("json", "png"):
        src, dst = os.path.join(out_dir, f"{name}.{ext}"), os.path.join(figures, f"{name}.{ext}")
        if os.path.abspath(src) != os.path.abspath(dst):
            shutil.copy(src, dst)
    write_section(name, text + f"\n\nPlot: `benchmarks/figures/{name}.png`, data: `benchmarks/figures/{name}.json`.")
