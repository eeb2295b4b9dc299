"""Tensor offload on a GPU: the kvikio tool (GDS, or kvikio's compat mode), the adaptive choice
among every tool for CUDA tensors, activation offload of a CUDA model (bit-equal gradients;
every kind of CUDA tensor back in its layout, through every tool), and fastckpt.save(tool="kvikio"). Skipped without CUDA; kvikio's own tests skip without kvikio."""
from __future__ import annotations

import os

import pytest
import torch

import fastckpt
from fastckpt.format import device_crc
from fastckpt.offload import ActivationOffload, TensorIO, available_tools, io_tools
from fastckpt.offload.io_tools import read_tensor, write_tensor
from fastckpt.write.gds import kvikio_mode
from workers.layout_watch import SavesForBackward, kinds_of_tensors, same_tensor

pytestmark = pytest.mark.gpu
needs_kvikio = pytest.mark.skipif(kvikio_mode() is None, reason="kvikio is not installed or has no driver")


@needs_kvikio
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_kvikio_tool_roundtrips_cuda_tensors(tmp_path, dtype):
    t = (torch.randn(3, 1 << 18, device="cuda") * 50).to(dtype)
    write_tensor(t, str(tmp_path / "k.fct"), "kvikio")
    back = read_tensor(str(tmp_path / "k.fct"), device="cuda")
    assert back.is_cuda and back.dtype == dtype and torch.equal(back, t)
    cpu = read_tensor(str(tmp_path / "k.fct"))  # a host can read the raw payload too
    assert torch.equal(cpu.cpu(), t.cpu())


@needs_kvikio
def test_adaptive_choice_for_cuda_tensors_includes_kvikio(tmp_path):
    assert available_tools(str(tmp_path), cuda=True)["kvikio"] is None
    io = TensorIO(mode="aware", aware="wr")
    t = torch.randn(1 << 20, device="cuda")
    used = set()
    for i in range(6):
        used.add(io.save(t, str(tmp_path / f"{i}.fct")))
        assert torch.equal(io.load(str(tmp_path / f"{i}.fct"), device="cuda"), t)
    assert "kvikio" in used


def test_activation_offload_of_a_cuda_model_is_bit_equal(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(512, 512), torch.nn.ReLU())]).cuda()
    x = torch.randn(1024, 512, device="cuda")
    grads = []
    for off in (None, ActivationOffload(str(tmp_path), threshold_mb=0.5)):
        model.zero_grad(set_to_none=True)
        if off is None:
            model(x).square().mean().backward()
        else:
            with off:
                model(x).square().mean().backward()
            assert off.stats["offloaded"] >= 6
        grads.append([p.grad.clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("tool", ["posix", "direct", "numpy", "torch", "kvikio"])
def test_every_kind_of_cuda_tensor_comes_back_to_autograd_as_it_was_saved(tmp_path, tool):
    if tool == "kvikio" and kvikio_mode() is None:
        pytest.skip("kvikio is not installed or has no driver")
    for name, t in kinds_of_tensors("cuda").items():
        off = ActivationOffload(str(tmp_path), threshold_mb=0, io=TensorIO(mode="tool", tool=tool))
        write_tensor(t, str(tmp_path / "f"), tool)
        back = read_tensor(str(tmp_path / "f"), device="cuda")
        assert same_tensor(back, t), (name, t.stride(), back.stride())
        os.unlink(tmp_path / "f")
        got = []
        x = torch.ones(2, device="cuda", requires_grad=True)
        with off:
            SavesForBackward.apply(x, t, got).sum().backward()
        assert off.stats["offloaded"] == 1 and len(got) == 1 and same_tensor(got[0], t), (name, t.stride())
    assert os.listdir(tmp_path) == []


@needs_kvikio
def test_save_with_kvikio_writes_cuda_records_in_place(tmp_path):
    state = {"w": torch.randn(1024, 1024, device="cuda"), "b": torch.randn(7, device="cuda")}
    fastckpt.save(state, tmp_path / "k.pt", tool="kvikio")
    got = fastckpt.load(tmp_path / "k.pt", map_location="cuda")
    assert all(torch.equal(got[k], state[k]) for k in state)


@needs_kvikio
@pytest.mark.skipif(not device_crc.available(), reason="needs CuPy")
def test_the_kvikio_tool_moves_no_byte_to_the_host_for_its_crc(tmp_path, monkeypatch):
    def host_crc(*a, **k):
        raise AssertionError("a CUDA tensor's CRC was taken on the host")

    monkeypatch.setattr(io_tools, "crc_of", host_crc)
    t = torch.randn(1 << 20, device="cuda")
    write_tensor(t, str(tmp_path / "k.fct"), "kvikio")
    assert torch.equal(read_tensor(str(tmp_path / "k.fct"), device="cuda"), t)  # verified on the device
