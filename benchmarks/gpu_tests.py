"""Records what `make gpu-check` said of the gpu tests on a lent GPU: RESULTS.md's gpu_tests section.

    python benchmarks/gpu_tests.py DIR [DIR ...]     # each DIR: one device call's $OUT, in order

Each DIR holds that call's env.txt (the machine: GPU, driver, torch and its CUDA, kvikio) and
gpu-tests.txt (tests/support/run_isolated.py's lines: PASS / FAIL / HANG / SKIP / NOTRUN, each
test in its own process). The section gives one row per call (when, device, counts) and, for
the last call, every test's line per file. Nothing here is measured or typed: it only reads.
"""
from __future__ import annotations

import argparse
import os
import re
from collections import Counter, defaultdict

from helpers.results import write_section

STATUSES = ("PASS", "FAIL", "HANG", "SKIP", "NOTRUN")


def read_call(folder: str) -> dict:
    env = open(os.path.join(folder, "env.txt")).read()
    lines = open(os.path.join(folder, "gpu-tests.txt")).read().splitlines()
    tests = []
    for line in lines:
        m = re.match(r"^(PASS|FAIL|HANG|SKIP|NOTRUN)\s+([\d.]+)s\s+(\S+::\S+)$", line)
        if m:
            tests.append({"status": m.group(1), "seconds": float(m.group(2)), "id": m.group(3)})
    if not tests:
        raise SystemExit(f"{folder}/gpu-tests.txt holds no test lines")
    when = re.search(r"date: (\S+ \S+)", env)
    gpu = re.search(r"^(NVIDIA [^,]+), (\d+ MiB), ([\d.]+)$", env, re.M)
    torch_line = re.search(r"^python .*$", env, re.M)
    return {"when": when.group(1) if when else "undated", "gpu": gpu.groups() if gpu else None,
            "torch": torch_line.group(0) if torch_line else "", "env": env, "tests": tests,
            "counts": Counter(t["status"] for t in tests)}


def render(calls: list[dict]) -> str:
    last = calls[-1]
    gpu = last["gpu"]
    head = (f"## gpu_tests.py — {last['when']}, {gpu[0] if gpu else 'unknown GPU'}"
            + (f" ({gpu[1]}, driver {gpu[2]})" if gpu else "") + "\n\n"
            f"`make gpu-check` on a lent device: every test marked `gpu`, each in its own process under a hard "
            f"timeout (tests/support/run_isolated.py). Machine of the last call: {last['torch']}; "
            + ", ".join(line for line in last["env"].splitlines()
                        if line.startswith(("kvikio", "deepspeed", "lightning", "cupy"))) + ".\n")
    rows = ["| call | when | tests | " + " | ".join(STATUSES) + " |", "|---|---|---|" + "---|" * len(STATUSES)]
    for i, c in enumerate(calls, 1):
        rows.append(f"| {i} | {c['when']} | {len(c['tests'])} | " + " | ".join(str(c["counts"][s]) for s in STATUSES)
                    + " |")
    by_file: dict = defaultdict(list)
    for t in last["tests"]:
        by_file[t["id"].split("::")[0]].append(t)
    detail = ["\nThe last call, file by file:\n",
              "| file | " + " | ".join(STATUSES) + " | not passed |", "|---|" + "---|" * (len(STATUSES) + 1)]
    for path in sorted(by_file):
        counts = Counter(t["status"] for t in by_file[path])
        bad = "; ".join(f"{t['status']} `{t['id'].split('::', 1)[1]}`" for t in by_file[path] if t["status"] != "PASS")
        detail.append(f"| `{path}` | " + " | ".join(str(counts[s]) for s in STATUSES) + f" | {bad or '—'} |")
    return head + "\n" + "\n".join(rows) + "\n" + "\n".join(detail)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("calls", nargs="+", help="each device call's $OUT folder, oldest first")
    ap.add_argument("--no-results", action="store_true", help="print the section only")
    a = ap.parse_args()
    text = render([read_call(folder) for folder in a.calls])
    print(text)
    if not a.no_results:
        write_section("gpu_tests", text)


if __name__ == "__main__":
    main()
