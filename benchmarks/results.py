"""Writes one benchmark's generated section into benchmarks/RESULTS.md (between its markers)."""
from __future__ import annotations

import os

HERE = os.path.dirname(os.path.abspath(__file__))


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
