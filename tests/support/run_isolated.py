"""Runs each selected test in its own process under a hard timeout: one PASS / FAIL / HANG / SKIP line each.

    python tests/support/run_isolated.py [--timeout S] [--jobs N] [--deadline S] [--log FILE]
                                         [--one-per-file [--files N]] -- PYTEST_ARGS...

`make test-gpu` runs it over `tests -m gpu`. A test that outlives --timeout is killed with its
whole process group (SIGKILL: a thread blocked in native code ignores pytest-timeout) and
counts as HANG. With --deadline, a test not started that many seconds after the first is not
run at all and counts as NOTRUN (the whole run then ends within deadline + timeout: what a
device call of bounded length needs). Lines are printed as tests end. Exit status: 0 when at
least one test ran and none failed, hung or was left unrun; 1 on any FAIL, HANG or NOTRUN; 3
when every test skipped (on a machine without CUDA nothing GPU-related ran).
Each test's output goes to --log, under a header naming the test. --one-per-file: every test is
collected, the first of each file runs (the CPU rehearsal of `make gpu-check`, where every gpu
test skips: a process per file shows each module imports and skips, at a tenth of the cost);
the others are listed as SAMPLED and count as nothing. --files N: of the first N files only
(the suite itself already runs every gpu test, each skipping, in its own processes: the
rehearsal needs the runner's path shown, not every module imported once more).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed


def collect(pytest_args: list[str]) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          *pytest_args], capture_output=True, text=True)
    ids = [line.strip() for line in out.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if out.returncode not in (0, 5):
        sys.exit(f"collecting the tests failed (exit {out.returncode}):\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    return ids


def run_one(test_id: str, timeout: float, start_by: float = float("inf")) -> tuple[str, float, str]:
    """(PASS | FAIL | HANG | SKIP | NOTRUN, seconds, output) of one test in a fresh process group;
    NOTRUN when its turn came after the monotonic time start_by."""
    t0 = time.monotonic()
    if t0 > start_by:
        return "NOTRUN", 0.0, "[not started: the run's deadline had passed]\n"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", test_id],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return "HANG", time.monotonic() - t0, output + f"\n[killed after {timeout:g} s]\n"
    took = time.monotonic() - t0
    if proc.returncode == 0:
        tail = output.strip().splitlines()[-1] if output.strip() else ""
        return ("SKIP" if "skipped" in tail and "passed" not in tail else "PASS"), took, output
    return "FAIL", took, output


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds one test may take")
    ap.add_argument("--jobs", type=int, default=1, help="tests run at once (each its own process)")
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds after which no further test is started (those left count as NOTRUN)")
    ap.add_argument("--log", default=None, help="file for every test's output")
    ap.add_argument("--one-per-file", action="store_true",
                    help="run only the first test of each file (the rest: SAMPLED, counted as nothing)")
    ap.add_argument("--files", type=int, default=None,
                    help="with --one-per-file: the first test of the first N files only")
    ap.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: what pytest selects")
    a = ap.parse_args(argv)
    args = a.pytest_args[1:] if a.pytest_args[:1] == ["--"] else a.pytest_args
    ids = collect(args)
    print(f"{len(ids)} test(s), each in its own process, {a.timeout:g} s each at most, {a.jobs} at a time",
          flush=True)
    if a.one_per_file:
        first = {}
        for t in ids:
            first.setdefault(t.split("::")[0], t)
        chosen = list(first.values())[:a.files] if a.files is not None else list(first.values())
        for t in ids:
            if t not in chosen:
                print(f"SAMPLED  {t}", flush=True)
        print(f"{len(chosen)} of them run: the first of each of {len(chosen)} of {len(first)} files "
              "(--one-per-file)", flush=True)
        ids = chosen
    counts = {"PASS": 0, "FAIL": 0, "HANG": 0, "SKIP": 0, "NOTRUN": 0}
    log = open(a.log, "w") if a.log else None
    start_by = time.monotonic() + a.deadline if a.deadline is not None else float("inf")
    with ThreadPoolExecutor(max(1, a.jobs)) as pool:
        futures = {pool.submit(run_one, t, a.timeout, start_by): t for t in ids}
        for done in as_completed(futures):
            test_id, (status, took, output) = futures[done], done.result()
            counts[status] += 1
            print(f"{status:4}  {took:6.1f}s  {test_id}", flush=True)
            if log is not None:
                log.write(f"===== {status} {took:.1f}s {test_id}\n{output}\n")
                log.flush()
    if log is not None:
        log.close()
    ran = counts["PASS"] + counts["FAIL"] + counts["HANG"]
    print(" ".join(f"{k} {v}" for k, v in counts.items()))
    if counts["FAIL"] or counts["HANG"] or counts["NOTRUN"]:
        return 1
    if ran == 0:
        print("no test ran: every one skipped (no CUDA device here?)")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
