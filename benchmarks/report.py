"""Assembles benchmarks/REPORT.md from what the benchmarks recorded: each one's generated
section of RESULTS.md (its tables, between its markers) and its plot in figures/.

    python benchmarks/report.py        # `make bench` runs every benchmark first, then this

Nothing is measured or typed here: a benchmark that has not been run yet is listed as missing.
"""
from __future__ import annotations

import datetime
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
DATE = r"\d{4}-\d{2}-\d{2}( \d{2}:\d{2})?"
# (marker name, heading, what it answers) in the order the report reads
SECTIONS = [
    ("save_load", "Save and load throughput vs the physical bound", "fastckpt vs torch.save/load, DCP save/async_save, "
     "against a direct write/read and a memcpy of the same size"),
    ("lightning_overhead", "Stall and overhead vs interval: Lightning", "FastCheckpointIO vs TorchCheckpointIO and "
     "AsyncCheckpointIO on a transformer LM"),
    ("deepspeed_overhead", "Stall and overhead vs interval: DeepSpeed", "the fastckpt engine vs DeepSpeed's default "
     "engine and its decoupled/fast engines"),
    ("gpu_overhead", "Training overhead on one GPU: every peer in one run", "fastckpt c/g/d vs torch.save, DCP "
     "async_save, Lightning's IO and DeepSpeed's engine, against the device→pinned copy and the disk"),
    ("layerwise_ddp", "Layer-wise vs plain c under DDP", "LightCheck's pipelining with the all-reduce, 2 ranks"),
    ("pmem_store", "Persistent-memory store", "pool saves and loads vs the file store"),
    ("offload", "Tensor offload (Fastensor)", "per-tool bandwidth, adaptive choice hit rate, largest batch under a "
     "memory cap"),
    ("tuned_interval", "Tuner: interval=\"auto\" vs its budget", "measured overhead against the budget q"),
    ("goodput", "Goodput vs interval", "PCcheck eq. 4 replayed on a failure trace"),
    ("reliability", "Reliability campaign", "kills, corruptions, faults, distributed kills, hostile files, soak"),
]


def sections(results: str) -> dict[str, str]:
    out = {}
    for m in re.finditer(r"<!-- (\w+):begin -->\n(.*?)\n<!-- \1:end -->", results, re.S):
        out[m.group(1)] = m.group(2).strip()
    return out


def recorded(section: str | None) -> str:
    """When a section was measured: its heading's date, else the span of its parts' dates."""
    if section is None:
        return "MISSING"
    when = re.search(DATE, section.split("\n", 1)[0])
    if when:
        return when.group(0)
    dates = sorted({m.group(0) for m in re.finditer(DATE, section)})
    return dates[0] if len(dates) == 1 else f"{dates[0]} – {dates[-1]}" if dates else "undated"


def build(results_path: str, figures: str) -> str:
    with open(results_path) as f:
        found = sections(f.read())
    lines = ["# fastckpt benchmark report", "",
             f"Assembled {datetime.datetime.now():%Y-%m-%d %H:%M} by `benchmarks/report.py` from the sections the "
             "benchmarks wrote into `RESULTS.md` and their plots in `figures/`. Each section names the run it "
             "comes from (date, machine, command); the readings and caveats are in `RESULTS.md`.", ""]
    lines += ["| section | answers | recorded |", "|---|---|---|"]
    for name, heading, what in SECTIONS:
        lines.append(f"| [{heading}](#{name}) | {what} | {recorded(found.get(name))} |")
    for name, heading, what in SECTIONS:
        lines += ["", f'<a id="{name}"></a>', f"## {heading}", "", f"_{what}._", ""]
        if name not in found:
            lines.append(f"**Missing**: `{name}` has not recorded a section yet (run its benchmark).")
            continue
        body = re.sub(r"^## ", "### ", found[name], flags=re.M)
        body = body.replace("`benchmarks/figures/", "`figures/")
        lines.append(body)
        png = os.path.join(figures, f"{name}.png")
        if os.path.exists(png) and f"](figures/{name}.png)" not in body:  # shown once, not only named
            lines += ["", f"![{heading}](figures/{name}.png)"]
    return "\n".join(lines) + "\n"


def main() -> None:
    text = build(os.path.join(HERE, "RESULTS.md"), os.path.join(HERE, "figures"))
    with open(os.path.join(HERE, "REPORT.md"), "w") as f:
        f.write(text)
    print(f"wrote {os.path.join(HERE, 'REPORT.md')} ({text.count(chr(10))} lines)")


if __name__ == "__main__":
    main()
