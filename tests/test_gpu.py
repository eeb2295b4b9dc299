"""GPU paths: side stream + events, pinned staging (c), device copy (g), kvikio (d). Skip without CUDA."""
from __future__ import annotations

import pytest
import torch

import fastckpt
from fastckpt.write.gds import kvikio_mode
from conftest import assert_same, state_matrix

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("strategy", ["c", "g", "d"])
@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
def test_cuda_state_roundtrip(tmp_path, strategy, fmt):
    state = state_matrix("cuda")
    with fastckpt.Checkpointer(tmp_path, strategy=strategy, format=fmt, chunk_mb=1) as ck:
        p = ck.save(state, step=1)
        ck.gate()
        info = p.wait()
        out = ck.load(map_location="cuda")
        assert ck.stats["pinned"] or strategy == "d"
    assert_same(state, out)
    assert out["big"].is_cuda
    if fmt == "torch":
        assert_same(state, torch.load(info.file_for(0), weights_only=True, map_location="cuda"))


def test_gate_protects_against_optimizer_overwrite(tmp_path):
    w = torch.randn(1 << 22, device="cuda")
    expect = w.clone()
    with fastckpt.Checkpointer(tmp_path, chunk_mb=4) as ck:
        p = ck.save({"w": w}, step=1)
        ck.gate()
        w.mul_(0)  # the "optimizer step" runs after the gate
        p.wait()
        assert torch.equal(ck.load()["w"], expect.cpu())


def test_kvikio_mode_is_reported():
    mode = kvikio_mode()
    print("kvikio mode:", mode)
    if mode is None:
        pytest.skip("kvikio is not installed on this device")
    assert mode in ("gds", "compat")
