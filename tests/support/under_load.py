"""Runs one command N times with K busy processes beside it: is its result the same under load?

    python tests/support/under_load.py [--times N] [--busy K] [--grep REGEX] [--log FILE] -- COMMAND...

Each busy process is `python3 -c 'while True: pass'`, started before the first run and killed
after the last, so every run shares the CPU with them. One line per run: its exit status,
seconds, and the lines of its output that match --grep (e.g. the demo's verdict lines, or
pytest's summary). Ends with how many runs exited 0. Exit status: 0 when every run did.
Issue 29's checks: `-- python -m fastckpt.demo` (idle: --busy 0; loaded: --busy 2) and
`-- python -m pytest -q tests/...` over the tests that compare bits across runs (`make
test-bits-loaded` runs that selection: the Makefile names its files and -k).
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--times", type=int, default=10)
    ap.add_argument("--busy", type=int, default=2, help="busy processes beside each run")
    ap.add_argument("--grep", default=r"YES|NO|passed|failed|error", help="output lines to show per run")
    ap.add_argument("--log", default=None, help="every run's whole output, appended here")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        ap.error("no command given (after --)")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
    ok = 0
    try:
        for i in range(1, a.times + 1):
            t0 = time.monotonic()
            r = subprocess.run(command, capture_output=True, text=True)
            seconds = time.monotonic() - t0
            out = r.stdout + r.stderr
            if a.log:
                with open(a.log, "a") as f:
                    f.write(f"===== run {i}: exit {r.returncode}, {seconds:.0f} s\n{out}\n")
            said = [line.strip() for line in out.splitlines() if re.search(a.grep, line)]
            ok += r.returncode == 0
            print(f"run {i}/{a.times}: exit {r.returncode}, {seconds:.0f} s, busy {a.busy}: " + " | ".join(said[-4:]),
                  flush=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    print(f"{ok} of {a.times} runs exited 0 (busy processes beside them: {a.busy})")
    return 0 if ok == a.times else 1


if __name__ == "__main__":
    sys.exit(main())
