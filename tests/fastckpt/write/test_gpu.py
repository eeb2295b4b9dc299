"""GPU paths through the Checkpointer and fastckpt.save: side streams + marks, pinned staging (c),
spare device memory (g), kvikio or staged-with-the-gate-held (d), layer-wise held writes,
loading onto CUDA, and kill -9 during a CUDA save. Skipped without CUDA (run: make test-gpu)."""
from __future__ import annotations

import random

import pytest
import torch

import fastckpt
from fastckpt.format import device_crc
from fastckpt.write import device_file
from fastckpt.verify import verify_file
from fastckpt.write.gds import kvikio_mode
from support.states import assert_same, assert_sharing, state_matrix
from support.processes import kill_at_random

pytestmark = pytest.mark.gpu
# c's first save, while staging still grows, goes through spare device memory (stats["spare_first"])
MODES = {"c": ("pinned-staging", "device-copy"), "g": ("device-copy",),
         "d": ("kvikio-gds", "kvikio-compat", "pinned-staging")}


@pytest.mark.parametrize("strategy", ["c", "g", "d"])
@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
def test_cuda_state_roundtrip(tmp_path, strategy, fmt):
    state = state_matrix("cuda")
    with fastckpt.Checkpointer(tmp_path, strategy=strategy, format=fmt, chunk_mb=1, stall_timeout_s=30) as ck:
        p = ck.save(state, step=1)
        assert p.write.mode in MODES[strategy], p.write.mode
        assert ck.stats["spare_first"] == (strategy == "c" and p.write.mode == "device-copy")
        ck.gate()
        info = p.wait()
        out = ck.load(map_location="cuda")
        assert ck.stats["pinned"] or p.write.mode.startswith("kvikio")
    assert_same(state, out)
    assert_sharing(out)  # each storage moved once: its views are still its views there
    assert out["big"].is_cuda
    if fmt == "torch":
        assert_same(state, torch.load(info.file_for(0), weights_only=True, map_location="cuda"))


@pytest.mark.parametrize("strategy", ["c", "g", "d"])
def test_gate_protects_against_optimizer_overwrite(tmp_path, strategy):
    """Every tensor — CUDA parameters and the CPU `step` counter Adam keeps — overwritten right
    after the gate, on the default stream: the checkpoint still holds the values as of save()."""
    w = torch.randn(1 << 22, device="cuda")
    step = torch.tensor(3.0)
    expect = {"w": w.clone(), "step": step.clone()}
    with fastckpt.Checkpointer(tmp_path, strategy=strategy, chunk_mb=4, stall_timeout_s=30) as ck:
        for i in range(3):
            p = ck.save({"w": w, "step": step}, step=i)
            ck.gate()
            w.mul_(0.5).add_(1)  # the "optimizer step" runs after the gate
            step.add_(1)
            p.wait()
            got = ck.load()
            assert torch.equal(got["w"], expect["w"].cpu()) and torch.equal(got["step"], expect["step"])
            expect = {"w": w.clone(), "step": step.clone()}


@pytest.mark.parametrize("strategy", ["c", "d"])
def test_held_cuda_write_copies_what_is_released(tmp_path, strategy):
    state = {f"l{i}": torch.randn(1 << 20, device="cuda") for i in range(4)}
    expect = {k: v.clone() for k, v in state.items()}
    with fastckpt.Checkpointer(tmp_path, strategy=strategy, chunk_mb=1, stall_timeout_s=30) as ck:
        p = ck.save(state, step=1, held=True)
        assert not p.copied()
        first = p.records_of({state["l0"].untyped_storage().data_ptr()})
        p.release(first)
        assert p.wait_records(first, timeout=30)
        ck.gate()  # releases the rest and waits for it
        for v in state.values():
            v.zero_()
        p.wait()
        assert_same(expect, ck.load(map_location="cuda"))


def test_one_file_save_of_cuda_tensors(tmp_path):
    state = state_matrix("cuda")
    fastckpt.save(state, tmp_path / "one.pt")
    assert_same(state, fastckpt.load(tmp_path / "one.pt", map_location="cuda"))


@pytest.mark.parametrize("strategy", ["c", "g", "d"])
def test_kill9_during_cuda_saves_newest_committed_loads_onto_cuda(tmp_path, strategy):
    from workers.crash_child import state_for
    root, rng = str(tmp_path / "ck"), random.Random(7)
    for i in range(6):
        committed = [0]

        def on_line(line: str) -> None:
            if line.startswith("committed"):
                committed[0] = max(committed[0], int(line.split()[1]))

        kill_at_random("crash_child.py", [root, "2", "torch", "cuda", strategy], rng, 1.5, on_line)
        ck = fastckpt.Checkpointer(root)
        info = ck.latest()
        if info is None:
            assert committed[0] == 0
            continue
        assert info.step >= committed[0]
        out = ck.load(map_location="cuda")
        assert out["model"]["w0"].is_cuda
        assert_same(state_for(info.step, "cuda"), out)


def test_kvikio_mode_is_reported():
    mode = kvikio_mode()
    print("kvikio mode:", mode)
    if mode is None:
        pytest.skip("kvikio is not installed on this device")
    assert mode in ("gds", "compat")


@pytest.mark.skipif(kvikio_mode() is None or not device_crc.available(), reason="needs kvikio and CuPy")
def test_a_kvikio_write_takes_its_crcs_on_the_device(tmp_path, monkeypatch):
    """d with kvikio: every record's CRC-32 is computed on the GPU while kvikio writes it; the file
    is not read back for them, and the CRCs written are the ones the loader checks."""
    def no_read_back(*a, **k):
        raise AssertionError("the file was read back for its CRCs")

    monkeypatch.setattr(device_file, "range_crcs", no_read_back)
    state = state_matrix("cuda")
    with fastckpt.Checkpointer(tmp_path, strategy="d", chunk_mb=1, stall_timeout_s=30) as ck:
        p = ck.save(state, step=1)
        assert p.write.mode.startswith("kvikio"), p.write.mode
        ck.gate()
        info = p.wait()
        assert_same(state, ck.load(map_location="cuda"))  # every CRC checked against the bytes on disk
    verify_file(info.file_for(0))  # and by the verifier, which reads every record back itself
