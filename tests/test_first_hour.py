"""What a new user meets in the first hour: the Makefile's commands keep working after `make
clean`, and every Python block of the README runs as written (tests/readme_blocks.py)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
def test_make_clean_forgets_the_install_stamp_with_the_extension():
    """`make clean` removed fastckpt/*.so but kept .venv/.installed, so the next `make demo`
    found nothing to do and failed with `cannot import name '_native'`."""
    said = subprocess.run(["make", "-n", "clean"], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert "fastckpt/*.so" in said and ".venv/.installed" in said
