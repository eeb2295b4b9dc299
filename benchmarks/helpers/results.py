"""Keeps one benchmark's results: its JSON and plot under the run's output folder (generated,
not kept in git: benchmarks/out/ by default), and its section of benchmarks/RESULTS.md, the one
report, showing its plot (kept in git as benchmarks/figures/NAME.png), whose index at the top is rebuilt from the sections each time one is written.

Nothing is measured or typed here: a benchmark that has not recorded a section yet is listed
in the index as missing.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from typing import Callable

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # benchmarks/
RESULTS = os.path.join(HERE, "RESULTS.md")
FIGURES = os.path.join(HERE, "figures")  # each section's picture, committed beside RESULTS.md
DATE = r"\d{4}-\d{2}-\d{2}( \d{2}:\d{2})?"
INDEX_BEGIN, INDEX_END = "<!-- index:begin -->", "<!-- index:end -->"
# (section name = the script's name, what it answers), in the order the index reads
SECTIONS = [
    ("save_load", "fastckpt vs torch.save/load, DCP save/async_save, against a direct write/read and a memcpy "
                  "of the same size"),
    ("many_tensors", "the same bytes in 16 to 1000 tensors: until durable, and the cost after the last data byte "
                     "(every record's header), against torch.save+fsync and a direct write"),
    ("lightning_overhead", "stall and overhead vs interval under Lightning: FastCheckpointIO vs TorchCheckpointIO "
                           "and AsyncCheckpointIO"),
    ("deepspeed_overhead", "stall and overhead vs interval under DeepSpeed: the fastckpt engine vs DeepSpeed's "
                           "default, decoupled and fast engines"),
    ("gpu_tests", "every gpu test on a lent GPU, each in its own process: PASS / FAIL / HANG / NOTRUN"),
    ("gpu_overhead", "training overhead on one GPU: fastckpt c/g/d vs every peer, against the device→pinned copy "
                     "and the disk"),
    ("layerwise_ddp", "LightCheck's layer-wise pipelining with the all-reduce vs plain c, DDP on 2 ranks"),
    ("pmem_store", "persistent-memory pool saves and loads vs the file store"),
    ("offload", "tensor offload (Fastensor): per-tool bandwidth, adaptive choice, largest batch under a cap"),
    ("tuned_interval", "interval=\"auto\": measured overhead against the budget q"),
    ("goodput", "goodput vs interval, PCcheck eq. 4 replayed on a failure trace"),
    ("tiers", "a memory tier + partner replica in front of the disk: recovery by failure, SIGTERM to durable, "
              "cost per step, goodput"),
    ("reliability", "the reliability campaign: kills, corruptions, faults, distributed kills, hostile files"),
    ("s3_clients", "which S3 client to build on: one multipart upload to a local SeaweedFS by obstore and by boto3, "
                   "with the client's and the server's CPU"),
    ("s3", "checkpoints to S3 on 2 ranks: fastckpt (direct, and tiers drained to it), DCP + FastStorageWriter, "
           "DCP + s3torchconnector, DCP + fsspec, the multipart bound and the local disk alone on one local "
           "SeaweedFS; blocked, until durable, load"),
]


def sections(text: str) -> dict[str, str]:
    """name -> the body a benchmark recorded between its markers."""
    return {m.group(1): _without_anchor(m.group(2)).strip()
            for m in re.finditer(r"<!-- (\w+):begin -->\n(.*?)\n<!-- \1:end -->", text, re.S)
            if m.group(1) != "index"}


def recorded(section: str | None) -> str:
    """When a section was measured: its heading's date, else the span of its parts' dates."""
    if section is None:
        return "MISSING"
    when = re.search(DATE, section.split("\n", 1)[0])
    if when:
        return when.group(0)
    dates = sorted({m.group(0) for m in re.finditer(DATE, section)})
    return dates[0] if len(dates) == 1 else f"{dates[0]} – {dates[-1]}" if dates else "undated"


def index(text: str) -> str:
    """The index of RESULTS.md: every benchmark, what it answers, when it was recorded."""
    found = sections(text)
    lines = ["| benchmark | answers | recorded |", "|---|---|---|"]
    for name, what in SECTIONS:
        where = f"[`{name}.py`](#{name})" if name in found else f"`{name}.py`"
        lines.append(f"| {where} | {what} | {recorded(found.get(name))} |")
    return "\n".join(lines)


def replace_block(text: str, begin: str, end: str, body: str, at_top: bool = False) -> str:
    block = f"{begin}\n{body}\n{end}"
    if begin in text and end in text:
        return text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    if at_top:  # after the title line
        head, _, rest = text.partition("\n")
        return f"{head}\n\n{block}\n{rest}"
    return text.rstrip() + "\n\n" + block + "\n"


def write_section(name: str, text: str, path: str = RESULTS) -> None:
    """Puts `text` between NAME's markers in RESULTS.md (after the rest, the first time) under
    an anchor the index links to, and rebuilds the index."""
    old = open(path).read() if os.path.exists(path) else "# Benchmark results\n"
    new = replace_block(old, f"<!-- {name}:begin -->", f"<!-- {name}:end -->",
                        f'<a id="{name}"></a>\n\n{_without_anchor(text)}')
    new = replace_block(new, INDEX_BEGIN, INDEX_END, index(new), at_top=True)
    with open(path, "w") as f:
        f.write(new)


def _without_anchor(text: str) -> str:
    return re.sub(r'^<a id="\w+"></a>\n\n', "", text)


def keep(name: str, out_dir: str, res: dict, text: str, plot: Callable[[dict, str], None], publish: bool) -> None:
    """Writes NAME.json and NAME.png into out_dir; with `publish`, puts `text` into RESULTS.md with
    the plot shown, the plot kept as benchmarks/figures/NAME.png (committed with the section)."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(res, f, indent=1)
    plot(res, os.path.join(out_dir, f"{name}.png"))
    if publish:
        os.makedirs(FIGURES, exist_ok=True)
        shutil.copyfile(os.path.join(out_dir, f"{name}.png"), os.path.join(FIGURES, f"{name}.png"))
        where = os.path.relpath(out_dir, os.path.dirname(HERE))
        write_section(name, text + f"\n\n![{name}](figures/{name}.png)\n\nThis run's data: `{where}/{name}.json` "
                                   "(generated, not kept in git).")
