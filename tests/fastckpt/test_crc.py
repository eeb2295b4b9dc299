"""The native CRC-32 (libdeflate when the machine has it, zlib otherwise) is the zip CRC-32:
it agrees with Python's zlib on every length and alignment, and a file written under one
backend verifies under the other."""
from __future__ import annotations

import os
import random
import sys
import zlib

import numpy as np
import torch

from support import warm

import fastckpt
from fastckpt import _native


def test_native_crc_matches_zlib_everywhere():
    rng = random.Random(7)
    buf = np.frombuffer(rng.randbytes(1 << 20), dtype=np.uint8)
    base = buf.ctypes.data
    cases = [(0, 0), (0, 1), (1, 7), (3, 64), (5, 4095), (0, 4096), (17, 65537), (0, buf.size)]
    cases += [(rng.randrange(1000), rng.randrange(200_000)) for _ in range(50)]
    for off, n in cases:
        seed = rng.randrange(1 << 32)
        want = zlib.crc32(buf[off:off + n].tobytes(), seed)
        assert _native.crc32(base + off, n, seed) == want, (off, n, _native.features()["crc32"])


def test_backends_read_each_others_files(tmp_path):
    state = {"w": torch.randn(300_000), "i": torch.arange(1000)}
    path = str(tmp_path / "x.ckpt")
    fastckpt.save(state, path)
    code = ("import sys, fastckpt; from fastckpt import _native; "
            "assert _native.features()['crc32'].startswith('zlib'); "
            "fastckpt.load(sys.argv[1]); fastckpt.save(fastckpt.load(sys.argv[1]), sys.argv[2])")
    env = dict(os.environ, FASTCKPT_CRC="zlib")
    other = str(tmp_path / "y.ckpt")
    warm.run([sys.executable, "-c", code, path, other], env=env, check=True)
    back = fastckpt.load(other)  # CRCs written by zlib, checked here by the default backend
    assert torch.equal(back["w"], state["w"]) and torch.equal(back["i"], state["i"])
