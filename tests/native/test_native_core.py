"""The native core's own C++ unit tests (native/tests, doctest): CRC, staging pool, write job,
pool. Built here from the core's sources (native/src, all but bindings.cc, against the headers in
native/include) with the same defines and libraries as the extension (no Python, no torch) and
run; every doctest case must pass. Needs doctest's header
(`apt-get install doctest-dev`, which .ci/run installs); without it this test is skipped.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess

import pytest

from support.paths import ROOT
NATIVE = os.path.join(ROOT, "native")
INCLUDE = os.path.join(NATIVE, "include")  # headers: #include "fastckpt/x.h"
SRC = os.path.join(NATIVE, "src")


def _compiler() -> str:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or "c++"


def _has_header(header: str) -> bool:
    probe = subprocess.run([_compiler(), "-x", "c++", "-std=c++17", "-E", "-"], input=f"#include <{header}>\n",
                           capture_output=True, text=True)
    return probe.returncode == 0


def _uses_libpmem2() -> bool:
    """As setup.py decides for the extension."""
    return not os.environ.get("FASTCKPT_NO_LIBPMEM2") and _has_header("libpmem2.h")


@pytest.fixture(scope="module")
def native_tests(tmp_path_factory) -> str:
    if not _has_header("doctest/doctest.h"):
        pytest.skip("doctest's header is not installed (apt-get install doctest-dev)")
    exe = str(tmp_path_factory.mktemp("native") / "native_tests")
    pmem2 = _uses_libpmem2()
    cmd = [_compiler(), "-std=c++17", "-O1", "-g0", "-Wall", "-Wextra", "-Werror", "-pthread", f"-I{INCLUDE}",
           *(["-DFASTCKPT_HAVE_LIBPMEM2=1"] if pmem2 else []),
           *sorted(glob.glob(os.path.join(NATIVE, "tests", "*.cc"))),
           *sorted(f for f in glob.glob(os.path.join(SRC, "*.cc")) if os.path.basename(f) != "bindings.cc"),
           "-o", exe, "-lz", "-ldl", *(["-lpmem2"] if pmem2 else [])]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, f"the native tests do not build:\n{build.stderr[-6000:]}"
    return exe


def test_every_native_unit_test_passes(native_tests, tmp_path):
    run = subprocess.run([native_tests], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
    cases = re.search(r"test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed", run.stdout)
    assert cases, run.stdout[-2000:]
    total, passed, failed = map(int, cases.groups())
    assert failed == 0 and passed == total >= 17, run.stdout[-2000:]
    assert os.listdir(tmp_path) == []  # each case removed its scratch directory
