"""`fastckpt verify` passes good files and fails (exit 1) on a flipped bit anywhere; ls/export/info."""
from __future__ import annotations

import random
import sys

import pytest
import torch
from safetensors import safe_open

import fastckpt
from fastckpt.tools.cli import main
from support import warm
from support.states import assert_same, state_matrix


def flip_positions(data: bytes, rng: random.Random, n: int) -> list[tuple[int, int]]:
    """(byte, bit) pairs hitting every region: all eight bits of the first/last bytes, of the
    recorded file CRC at the end and of every fastckpt key name (a case flip of a hex digit or
    a renamed key once went unnoticed), plus evenly spaced and random bytes with a random bit."""
    size = len(data)
    fixed = [0, 1, 4, 8, 30, 100, 4095, 4096, size // 2, size - 20, size - 30, size - 60]
    fixed += list(range(size - 12, size))
    at = data.find(b"fastckpt")
    while at >= 0:
        fixed += list(range(at, at + 14))
        at = data.find(b"fastckpt", at + 1)
    some = [size * k // 40 for k in range(40)] + [rng.randrange(size) for _ in range(n)]
    pairs = {(p, b) for p in fixed for b in range(8)} | {(p, rng.randrange(8)) for p in some}
    return sorted((p, b) for p, b in pairs if 0 <= p < size)


@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
def test_verify_detects_any_flipped_bit(tmp_path, fmt, capsys):
    path = str(tmp_path / f"x.{fmt}")
    fastckpt.save(state_matrix(), path, format=fmt)
    assert main(["verify", path]) == 0
    data = open(path, "rb").read()
    for pos, bit in flip_positions(data, random.Random(3), 60):
        bad = bytearray(data)
        bad[pos] ^= 1 << bit
        with open(path, "wb") as f:
            f.write(bad)
        assert main(["verify", path]) == 1, f"flip of bit {bit} at byte {pos} of {len(data)} went unnoticed"
        with pytest.raises((fastckpt.CorruptCheckpointError, fastckpt.UnsafeCheckpointError)):
            fastckpt.load(path)
    with open(path, "wb") as f:
        f.write(data)
    assert main(["verify", path]) == 0


def test_verify_root_names_the_chunk(tmp_path, capsys):
    with fastckpt.Checkpointer(tmp_path, chunk_mb=1) as ck:
        info = ck.save({"w": torch.randn(1 << 20)}, step=3).wait()
    path = info.file_for(0)
    with open(path, "r+b") as f:
        f.seek(4096 + (2 << 20) + 5)  # inside the third 1 MiB chunk of the storage record
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    capsys.readouterr()
    r = warm.run([sys.executable, "-m", "fastckpt.tools.cli", "verify", str(tmp_path)],
                 capture_output=True, text=True)
    assert r.returncode == 1
    assert "first bad chunk: 2 (record archive/data/0" in r.stdout, r.stdout


def test_ls_export_info(tmp_path, capsys):
    state = state_matrix()
    with fastckpt.Checkpointer(tmp_path / "ck") as ck:
        ck.save(state, step=10).wait()
        ck.save(state, step=20).wait()
    assert main(["ls", str(tmp_path / "ck")]) == 0
    out = capsys.readouterr().out
    assert "20" in out and "committed" in out
    st = str(tmp_path / "x.safetensors")
    assert main(["export", str(tmp_path / "ck"), st, "--step", "10", "--to", "safetensors"]) == 0
    with safe_open(st, "pt") as f:
        assert torch.equal(f.get_tensor("big"), state["big"])
    back = str(tmp_path / "back.pt")
    assert main(["export", st, back, "--to", "torch"]) == 0
    assert_same(state, torch.load(back, weights_only=True), strides=False)  # an export holds values, not views
    assert main(["info"]) == 0
    assert "o_direct" in capsys.readouterr().out
    assert main(["ls", str(tmp_path / "nothing")]) == 2  # nothing there is not corruption (1)
    assert main(["verify", str(tmp_path / "nothing")]) == 2
