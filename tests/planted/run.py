"""`make test-planted`: every bug planted on purpose (bugs.py) is caught by its tests.

    python tests/planted/run.py [--only NAME ...] [--timeout S]

First the tests of every bug run on a scratch copy of this tree as it is, and must pass (a
test failing anyway would prove nothing). Then, for each bug: a scratch copy (the files git
knows, as they are now, and the built native extension), the bug's edits applied (an edit
that no longer finds its text fails the run), the native extension rebuilt when an edit
touches native/, and its tests run there — PYTHONPATH the copy, so every process they start
runs the planted code. Caught: the tests fail. One line per bug, naming the test that caught
it; exit status 1 if any bug survived or could not be planted.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from bugs import BUGS, Bug  # noqa: E402


def scratch_copy(into: str) -> str:
    """The tree as it is now (tracked and untracked files git does not ignore) and its built extension."""
    files = subprocess.run(["git", "-C", ROOT, "ls-files", "-co", "--exclude-standard", "-z"], check=True,
                           capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = os.path.join(ROOT, rel)
        if os.path.isfile(src):
            dst = os.path.join(into, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(src, dst)
    for so in glob.glob(os.path.join(ROOT, "fastckpt", "_native*.so")):
        shutil.copy2(so, os.path.join(into, "fastckpt"))
    return into


def plant(tree: str, bug: Bug) -> None:
    for rel, old, new in bug.edits:
        path = os.path.join(tree, rel)
        with open(path) as f:
            text = f.read()
        if text.count(old) != 1:
            raise LookupError(f"{bug.name}: {rel} holds its text {text.count(old)} times, not once (the code "
                              "moved: plant the bug anew)")
        with open(path, "w") as f:
            f.write(text.replace(old, new))
    if any(rel.startswith("native/") for rel, _, _ in bug.edits):
        subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=tree, check=True,
                       capture_output=True)


def run_tests(tree: str, args: tuple, timeout: float) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH", "")) if p))
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *args],
                              cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
        return proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        return 124, f"{e.stdout or ''}\nran past {timeout:g} s"


def first_failure(out: str) -> str:
    m = re.search(r"^FAILED (\S+)", out, re.M) or re.search(r"^ERROR (\S+)", out, re.M)
    return m.group(1) if m else out.strip().splitlines()[-1][:160] if out.strip() else "?"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="these bugs only (names from bugs.py)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds one bug's tests may take")
    a = ap.parse_args(argv)
    bugs = [b for b in BUGS if a.only is None or b.name in a.only]
    if a.only and len(bugs) != len(a.only):
        ap.error(f"unknown bug(s): {sorted(set(a.only) - {b.name for b in BUGS})}")
    failed = []
    with tempfile.TemporaryDirectory(prefix="fastckpt-planted-") as work:
        clean = scratch_copy(os.path.join(work, "clean"))
        for bug in bugs:  # the unplanted tree passes every test that must catch a bug
            code, out = run_tests(clean, bug.tests, a.timeout)
            if code != 0:
                print(f"BASELINE FAILS {bug.name}: {' '.join(bug.tests)}: {first_failure(out)}", flush=True)
                failed.append(bug.name)
        if failed:
            print("the tests fail without any bug planted; nothing is proven", flush=True)
            return 1
        for bug in bugs:
            t0 = time.monotonic()
            tree = scratch_copy(os.path.join(work, bug.name))
            try:
                plant(tree, bug)
            except (LookupError, subprocess.CalledProcessError) as e:
                print(f"NOT PLANTED {bug.name}: {e}", flush=True)
                failed.append(bug.name)
                continue
            code, out = run_tests(tree, bug.tests, a.timeout)
            took = time.monotonic() - t0
            if code == 0:
                print(f"SURVIVED    {bug.name} ({bug.what}): {' '.join(bug.tests)} passed", flush=True)
                failed.append(bug.name)
            else:
                print(f"caught      {bug.name} ({bug.what}) by {first_failure(out)} [{took:.0f} s]", flush=True)
            shutil.rmtree(tree, ignore_errors=True)
    print(f"{len(bugs) - len(failed)} of {len(bugs)} planted bugs caught", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
