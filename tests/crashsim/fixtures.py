"""The fixtures every power-loss test takes (tests/conftest.py lends them to every test):

    shim  the recording library (record_shim.c), built once per module;
    work  a scratch folder where the judged disks are written out, in memory when /dev/shm is there.
"""
from __future__ import annotations

import os
import tempfile

import pytest

from .harness import build_shim


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> str:
    return build_shim(str(tmp_path_factory.mktemp("shim")))


@pytest.fixture
def work():
    """Disks are written out in memory (/dev/shm) when there is one: hundreds per test."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="fastckpt-crashsim-", dir=base) as d:
        yield d
