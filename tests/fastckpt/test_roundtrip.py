"""Bit-exact round trips over the dtype/shape/sharing matrix, both formats, every strategy."""
from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

import fastckpt
from fastckpt.tools.cli import main as cli_main
from support.page_cache import drop_cache, memory_filesystem, resident_fraction
from support.states import assert_same, assert_sharing, flip_byte, state_matrix


@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
@pytest.mark.parametrize("strategy", ["c", "g", "d"])
def test_single_file_roundtrip(tmp_path, fmt, strategy):
    state = state_matrix()
    path = tmp_path / f"x.{fmt}"
    n = fastckpt.save(state, path, format=fmt, strategy=strategy)
    assert n == path.stat().st_size
    out = fastckpt.load(path)
    assert_same(state, out)
    assert_sharing(out)


@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
def test_a_load_onto_another_device_keeps_every_view_of_a_storage_a_view_with_its_strides(tmp_path, fmt):
    """map_location moves each storage once, not each tensor: a slice with gaps comes back with
    its strides, still a view of its base (the meta device stands in for a GPU here; the gpu
    tests load onto CUDA). Moved one by one, base[3:9, ::3] came back contiguous, on its own."""
    state = state_matrix()
    fastckpt.save(state, tmp_path / "x", format=fmt)
    out = fastckpt.load(tmp_path / "x", map_location="meta")
    for k in ("base", "transposed", "slice", "row"):
        assert out[k].is_meta and out[k].stride() == state[k].stride(), k
        assert out[k].untyped_storage().nbytes() == state["base"].untyped_storage().nbytes(), k


@pytest.mark.parametrize("store", ["root", "path", "pmem"])
@pytest.mark.parametrize("state", [{}, {"step": 3, "names": ["a", None]}], ids=["empty", "no-tensor"])
def test_a_state_without_tensors_round_trips(tmp_path, store, state):
    """DeepSpeed's pipeline engine saves a layer without parameters as a dict with no tensor:
    the data extent is empty (it failed with "data must start 4096-aligned")."""
    root = tmp_path / ("pool" if store == "pmem" else "ck")
    ck = fastckpt.Checkpointer(str(root), store=store, **({"pool_mb": 16} if store == "pmem" else {}))
    try:
        if store == "path":
            root.mkdir()
            ck.save(state, step=1, path=str(root / "x.pt")).wait()
            out = fastckpt.load(root / "x.pt")
            assert torch.load(root / "x.pt", weights_only=True) == state
        else:
            ck.save(state, step=1).wait()
            out = ck.load()
    finally:
        ck.close()
    assert out == state


def test_torch_load_reads_our_files(tmp_path):
    state = state_matrix()
    path = tmp_path / "x.pt"
    fastckpt.save(state, path)
    for kwargs in ({"weights_only": True}, {"weights_only": True, "mmap": True}):
        out = torch.load(path, **kwargs)
        assert_same(state, out)
        assert_sharing(out)


def test_storage_records_are_4096_aligned(tmp_path):
    import zipfile
    path = tmp_path / "x.pt"
    fastckpt.save(state_matrix(), path)
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None  # the zip CRC-32 of every record
        with open(path, "rb") as f:
            for info in z.infolist():
                if "/data/" in info.filename:
                    f.seek(info.header_offset + 26)
                    nlen, elen = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
                    assert (info.header_offset + 30 + nlen + elen) % 4096 == 0, info.filename


def test_safe_open_reads_safetensors_files(tmp_path):
    state = state_matrix()
    path = tmp_path / "x.safetensors"
    fastckpt.save(state, path, format="safetensors")
    with safe_open(str(path), "pt") as f:
        keys = list(f.keys())
        assert "big" in keys and "optim.state.0.exp_avg" in keys
        assert torch.equal(f.get_tensor("big"), state["big"])
        assert torch.equal(f.get_tensor("dt_bfloat16"), state["dt_bfloat16"])
    with open(path, "rb") as fh:
        hlen = int.from_bytes(fh.read(8), "little")
    assert (8 + hlen) % 4096 == 0


def test_we_read_torch_save_files(tmp_path):
    state = state_matrix()
    path = tmp_path / "t.pt"
    torch.save(state, path)
    out = fastckpt.load(path)
    assert_same(state, out)
    assert_sharing(out)


def test_safetensors_refuses_unknown_objects_unless_asked(tmp_path):
    class Thing:
        pass
    with pytest.raises(fastckpt.ConfigError, match="allow_pickle"):
        fastckpt.save({"x": Thing()}, tmp_path / "x.safetensors", format="safetensors")


def test_large_nested_lightning_like_state(tmp_path):
    model = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True), 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8, 64)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, 5)
    ckpt = {"epoch": 1, "global_step": 10, "pytorch-lightning_version": "2.5.0",
            "state_dict": model.state_dict(), "optimizer_states": [opt.state_dict()],
            "lr_schedulers": [sched.state_dict()],
            "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 1}}}},
            "callbacks": {"ModelCheckpoint{'monitor': None}": {"best_model_score": None, "dirpath": "/x"}},
            "hyper_parameters": {"lr": 0.001, "layers": 2}}
    for fmt in ("torch", "safetensors"):
        p = tmp_path / f"l.{fmt}"
        fastckpt.save(ckpt, p, format=fmt)
        assert_same(ckpt, fastckpt.load(p))


@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
@pytest.mark.parametrize("mmap", [True, False])
def test_load_modes_and_copy_on_write(tmp_path, fmt, mmap):
    state = state_matrix()
    path = tmp_path / f"x.{fmt}"
    fastckpt.save(state, path, format=fmt)
    out = fastckpt.load(path, mmap=mmap)
    assert_same(state, out)
    out["big"].add_(1.0)  # a private mapping: the file must not change
    assert_same(state, fastckpt.load(path))
    assert cli_main(["verify", str(path)]) == 0


def test_a_verified_load_of_a_cold_file_reads_around_the_page_cache_and_still_checks_every_byte(tmp_path):
    """A file not in the page cache is read (large records with O_DIRECT into a bounce buffer,
    CRC'd and copied out) rather than mapped and faulted in: the same state comes back, the
    file's pages stay out of the cache, and a flipped byte is still caught. A cached file is
    mapped as before (its records are views of the file's pages)."""
    kind = memory_filesystem(tmp_path)
    if kind:
        pytest.skip(f"{tmp_path} is on {kind}: its pages stay in memory, no file is ever cold there")
    g = torch.Generator().manual_seed(5)
    state = {"big": torch.randn(3 << 20, generator=g), "odd": torch.randn(1001, generator=g), "n": 4}
    path = tmp_path / "cold.pt"
    fastckpt.save(state, path)
    drop_cache(str(path))
    assert resident_fraction(str(path)) < 0.1
    out = fastckpt.load(path)
    assert_same(state, out)
    assert resident_fraction(str(path)) < 0.5  # the 12 MiB record went around the cache
    fastckpt.load(path, verify=False)["big"].sum()  # mapped, faulted in: now cached
    assert resident_fraction(str(path)) > 0.9
    warm = fastckpt.load(path)
    assert_same(state, warm)
    flip_byte(path)
    drop_cache(str(path))
    with pytest.raises(fastckpt.CorruptCheckpointError):
        fastckpt.load(path)
