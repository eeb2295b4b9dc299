"""The README's figures are RESULTS.md's: every number of a bullet of the README's `## Figures`
is in the section of benchmarks/RESULTS.md the bullet links to (between its `<!-- NAME:begin -->`
and `<!-- NAME:end -->`, which the benchmark that measured it writes). A figure typed by hand, or
left behind when a benchmark is rerun, fails here (issue 65: the README said 0.28x where
RESULTS.md said 0.35x)."""
from __future__ import annotations

import os
import re

from support.paths import ROOT

NUMBER = re.compile(r"(?<![\w.])-?\d+\.\d+|(?<![\w.])\d{3,}(?![\w.])")  # decimals, and whole numbers of 3+ digits


def figures() -> list[tuple[str, str]]:
    readme = open(os.path.join(ROOT, "README.md")).read()
    section = readme.split("\n## Figures\n", 1)[1].split("\n## ", 1)[0]
    bullets = re.split(r"\n- ", "\n" + section.split("\n- ", 1)[1])
    out = []
    for b in (b for b in bullets if b.strip()):
        links = re.findall(r"\(benchmarks/RESULTS\.md#(\w+)\)", b)
        assert len(links) == 1, f"a figure names the one RESULTS.md section it comes from: {b!r}"
        out.append((links[0], re.sub(r"\[[^\]]*\]\([^)]*\)", "", b)))
    return out


def section(name: str) -> str:
    text = open(os.path.join(ROOT, "benchmarks", "RESULTS.md")).read()
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    assert begin in text and end in text, f"RESULTS.md has no section {name}"
    return text.split(begin, 1)[1].split(end, 1)[0]


def missing_from(bullet: str, recorded: str) -> list[str]:
    return [n for n in NUMBER.findall(bullet) if not re.search(rf"(?<![\w.]){re.escape(n)}(?![\d])", recorded)]


def test_every_figure_of_the_readme_is_in_the_results_section_it_links():
    found = figures()
    assert len(found) >= 5, found
    for name, bullet in found:
        missing = missing_from(bullet, section(name))
        assert not missing, f"README figure ({name}) not in RESULTS.md's {name} section: {missing}\n{bullet}"


def test_a_figure_left_behind_is_caught():
    """The check itself, on the README's old DCP bullet against today's dcp section."""
    old = "durable in 2.518 s, 1.31x faster than DCP async_save; through torchtitan's manager blocked 0.28x"
    assert missing_from(old, section("dcp")) == ["2.518", "1.31", "0.28"]
    recorded = NUMBER.findall(section("dcp"))[:3]  # numbers the section holds, whatever its last run measured
    assert len(recorded) == 3 and missing_from(f"blocked {recorded[0]}x, {' and '.join(recorded[1:])}",
                                                 section("dcp")) == []
