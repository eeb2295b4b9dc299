"""Activation offload hands back exactly the tensor it took — shape, strides, dtype, device and
values — through every tool, and writes only what frees memory.

A transposed matrix handed back contiguous holds the same bytes but sends backward's matmul
down another BLAS path (SGEMM(T,N) for SGEMM(N,N)), which on some CPUs computes other bits:
so these tests compare strides, which differ on every machine, not only results that differ
on some."""
from __future__ import annotations

import os

import pytest
import torch

from fastckpt.offload import ActivationOffload, TensorIO
from fastckpt.offload.io_tools import read_tensor, write_tensor
from workers.layout_watch import BlockNet, LayoutWatch, SavesForBackward, kinds_of_tensors, same_tensor


HOST_TOOLS = ("posix", "direct", "numpy", "torch")


@pytest.mark.parametrize("tool", HOST_TOOLS)
def test_every_kind_of_tensor_comes_back_from_a_file_as_it_was(tmp_path, tool):
    for name, t in kinds_of_tensors().items():
        path = str(tmp_path / name)
        write_tensor(t, path, tool)
        back = read_tensor(path)
        assert same_tensor(back, t), (name, t.stride(), back.stride())


@pytest.mark.parametrize("tool", HOST_TOOLS)
def test_every_kind_of_saved_tensor_comes_back_to_autograd_as_it_was_saved(tmp_path, tool):
    for name, t in kinds_of_tensors().items():
        # one offload each: the test holds every tensor, and an offload that saw a storage
        # outlive its file keeps it in memory from then on (big.t() after big)
        off = ActivationOffload(str(tmp_path), threshold_mb=0, io=TensorIO(mode="tool", tool=tool))
        got = []
        x = torch.ones(2, requires_grad=True)
        with off:
            SavesForBackward.apply(x, t, got).sum().backward()
        assert off.stats["offloaded"] == 1, name  # it went through a file
        assert len(got) == 1 and same_tensor(got[0], t), (name, t.stride(), got[0].stride())
    assert os.listdir(tmp_path) == []


def test_a_storage_written_as_it_lies_is_not_copied_first(tmp_path):
    """A transposed or channels_last tensor's payload is its storage as it lies (the file holds
    no more bytes than the tensor), where a slice with gaps writes its elements alone."""
    t = torch.randn(256, 128).t()
    write_tensor(t, str(tmp_path / "t"), "posix")
    write_tensor(t[:, ::2], str(tmp_path / "s"), "posix")
    from fastckpt.offload import tensor_file
    assert tensor_file.read(str(tmp_path / "t"))["order"] == "storage"
    assert tensor_file.read(str(tmp_path / "s"))["order"] == "elements"
    assert os.path.getsize(tmp_path / "t") == tensor_file.HEADER + t.numel() * 4
    assert os.path.getsize(tmp_path / "s") == tensor_file.HEADER + t.numel() * 2


def test_a_file_without_strides_reads_as_the_contiguous_tensor_it_holds(tmp_path):
    """Files written before strides were kept have none in their header."""
    import json
    import struct
    from fastckpt.offload import tensor_file
    t = torch.arange(12, dtype=torch.float32).view(3, 4)
    write_tensor(t, str(tmp_path / "old"), "posix")
    with open(tmp_path / "old", "r+b") as f:
        raw = f.read(tensor_file.HEADER)
        (n,) = struct.unpack_from("<I", raw, 8)
        h = json.loads(raw[12:12 + n])
        del h["stride"], h["order"]
        body = json.dumps(h).encode()
        f.seek(0)
        f.write((tensor_file.MAGIC + struct.pack("<I", len(body)) + body).ljust(tensor_file.HEADER, b"\0"))
    assert same_tensor(read_tensor(str(tmp_path / "old")), t)


@pytest.mark.parametrize("damage,match", [({"stride": [4, -1]}, "strides"), ({"stride": [4]}, "strides"),
                                          ({"order": "sideways"}, "order"), ({"stride": [8, 1]}, "nbytes")])
def test_a_header_whose_geometry_does_not_fit_its_payload_is_refused_clearly(tmp_path, damage, match):
    import json
    import struct
    from fastckpt.errors import CorruptCheckpointError
    from fastckpt.offload import tensor_file
    write_tensor(torch.randn(3, 4), str(tmp_path / "f"), "posix")
    with open(tmp_path / "f", "r+b") as f:
        raw = f.read(tensor_file.HEADER)
        (n,) = struct.unpack_from("<I", raw, 8)
        h = dict(json.loads(raw[12:12 + n]), **damage)
        body = json.dumps(h).encode()
        f.seek(0)
        f.write((tensor_file.MAGIC + struct.pack("<I", len(body)) + body).ljust(tensor_file.HEADER, b"\0"))
    with pytest.raises(CorruptCheckpointError, match=match):
        read_tensor(str(tmp_path / "f"))


def test_a_parameter_or_a_view_of_one_stays_in_memory(tmp_path):
    """Linear saves weight.t() when its input needs a gradient: the parameter lives on, so
    writing the view frees nothing."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
    with ActivationOffload(str(tmp_path), threshold_mb=0, io=TensorIO(mode="tool", tool="posix")) as off:
        model(torch.randn(64, 256)).sum().backward()
    assert off.stats["kept_alive_elsewhere"] == 1  # the second Linear's weight.t()
    # the input, and the ReLU's output (saved by the ReLU and by the second Linear: written once)
    assert off.stats["bytes"] == 2 * 64 * 256 * 4 and off.stats["shared"] == 1


def test_a_storage_that_outlives_its_offload_is_kept_in_memory_from_then_on(tmp_path):
    """A buffer saved for backward, and the caller's batch held across backward: their first
    step writes them (nothing tells at pack time), backward sees them still alive, and later
    steps keep them — the same storage, or the tensor saved at the same place of the step."""
    buffer = torch.randn(64, 256)  # a module's buffer: the same storage every step
    off = ActivationOffload(str(tmp_path), threshold_mb=0, io=TensorIO(mode="tool", tool="posix"))
    written = []
    for step in range(3):
        batch = torch.randn(64, 256)  # the caller holds it until after backward: a new one each step
        w = torch.randn(256, 256, requires_grad=True)
        before = off.stats["bytes"]
        with off:
            ((batch @ w) * buffer).tanh().sum().backward()  # mm saves batch, mul buffer, tanh its output
        written.append(off.stats["bytes"] - before)
    fresh = 64 * 256 * 4  # the tanh output: the only saved tensor nobody else holds
    assert written == [3 * fresh, fresh, fresh]
    assert off.stats["kept_alive_elsewhere"] >= 2 * 2


def test_a_tensor_only_autograd_holds_is_still_written_every_step(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 8))
    off = ActivationOffload(str(tmp_path), threshold_mb=0, io=TensorIO(mode="tool", tool="posix"))
    per_step = []
    for _ in range(3):
        before = off.stats["offloaded"]
        with off:
            model(torch.randn(64, 256)).sum().backward()  # the batch dies with forward's locals
        per_step.append(off.stats["offloaded"] - before)
    assert per_step[0] == per_step[1] == per_step[2] >= 3


def test_lightning_callback_hands_a_transformer_block_its_tensors_as_saved_and_trains_bit_equal(tmp_path):
    """The TensorOffload callback on a transformer block (attention's transposes, LayerNorm,
    Linear): every tensor autograd gets back has the layout it saved, every gradient equals
    the run without offload bit for bit."""
    import lightning as L
    from lightning.pytorch.callbacks import Callback

    from lightning_fastckpt import TensorOffload
    from workers.lit_app import trainer

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = BlockNet(width=64)

        def training_step(self, batch, i):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    class Grads(Callback):
        def __init__(self):
            self.seen = []

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            self.seen.append({n: p.grad.clone() for n, p in pl_module.named_parameters()})

    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(48, 32, generator=g), torch.randn(48, 8, generator=g))
    runs = {}
    for name in ("plain", "offload"):
        torch.manual_seed(0)
        grads, cbs = Grads(), []
        if name == "offload":
            cbs = [TensorOffload(str(tmp_path / "act"), threshold_mb=0.001, mode="tool", tool="posix")]
            watch = LayoutWatch(cbs[0].offload)
        trainer(None, [grads, *cbs], max_steps=3).fit(Net(), torch.utils.data.DataLoader(data, batch_size=16))
        runs[name] = grads.seen
    assert watch.mismatches == [] and watch.checked >= 3 * 8
    assert len(runs["plain"]) == len(runs["offload"]) == 3
    for plain, got in zip(runs["plain"], runs["offload"]):
        for n in plain:
            assert torch.equal(plain[n], got[n]), n
    assert os.listdir(tmp_path / "act") == []
