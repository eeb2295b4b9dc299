"""Runs each selected test in its own process under a hard timeout: one PASS / FAIL / HANG / SKIP line each.

    python tests/support/run_isolated.py [--timeout S] [--jobs N] [--log FILE] -- PYTEST_ARGS...

`make test-gpu` runs it over `tests -m gpu`. A test that outlives --timeout is killed with its
whole process group (SIGKILL: a thread blocked in native code ignores pytest-timeout) and
counts as HANG. Exit status: 0 when at least one test ran and none failed or hung; 1 on any
FAIL or HANG; 3 when every test skipped (on a machine without CUDA nothing GPU-related ran).
Each test's output goes to --log, under a header naming the test.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def collect(pytest_args: list[str]) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          *pytest_args], capture_output=True, text=True)
    ids = [line.strip() for line in out.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if out.returncode not in (0, 5):
        sys.exit(f"collecting the tests failed (exit {out.returncode}):\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    return ids


def run_one(test_id: str, timeout: float) -> tuple[str, float, str]:
    """(PASS | FAIL | HANG | SKIP, seconds, output) of one test in a fresh process group."""
    t0 = time.monotonic()
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
    ap.add_argument("--log", default=None, help="file for every test's output")
    ap.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: what pytest selects")
    a = ap.parse_args(argv)
    args = a.pytest_args[1:] if a.pytest_args[:1] == ["--"] else a.pytest_args
    ids = collect(args)
    print(f"{len(ids)} test(s), each in its own process, {a.timeout:g} s each at most, {a.jobs} at a time",
          flush=True)
    counts = {"PASS": 0, "FAIL": 0, "HANG": 0, "SKIP": 0}
    log = open(a.log, "w") if a.log else None
    with ThreadPoolExecutor(max(1, a.jobs)) as pool:
        for test_id, (status, took, output) in zip(ids, pool.map(lambda t: run_one(t, a.timeout), ids)):
            counts[status] += 1
            print(f"{status:4}  {took:6.1f}s  {test_id}", flush=True)
            if log is not None:
                log.write(f"===== {status} {took:.1f}s {test_id}\n{output}\n")
                log.flush()
    if log is not None:
        log.close()
    ran = counts["PASS"] + counts["FAIL"] + counts["HANG"]
    print(" ".join(f"{k} {v}" for k, v in counts.items()))
    if counts["FAIL"] or counts["HANG"]:
        return 1
    if ran == 0:
        print("no test ran: every one skipped (no CUDA device here?)")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
