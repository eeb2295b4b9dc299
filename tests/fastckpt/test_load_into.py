"""Checkpointer.load(into=...): tensors that are their whole storage are read straight into, the
rest copied; a structure that differs is refused before anything is written; a corrupt newest
checkpoint passed over still leaves the older one's values."""
from __future__ import annotations

import os

import pytest
import torch

import fastckpt
import fastckpt.format.torch_format as torch_format


def saved_state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    big = torch.randn(64, 32, generator=g)
    tied = torch.randn(16, 8, generator=g)
    return {"model": {"w": torch.randn(128, 64, generator=g), "b": torch.randn(64, generator=g),
                      "half": torch.randn(40, generator=g).half(), "empty": torch.zeros(0),
                      "embed": tied, "head": tied, "row": big[3], "t": torch.randn(8, 16, generator=g).t()},
            "opt": {"state": {0: {"exp_avg": torch.randn(128, 64, generator=g), "step": torch.tensor(seed)}},
                    "param_groups": [{"lr": 0.1 * seed, "params": [0]}]},
            "step": seed}


def blank_like(state):
    """A destination of the same structure whose tensors hold nothing yet (zeros), tied and
    strided the way the saved ones were."""
    if isinstance(state, torch.Tensor):
        return torch.zeros_like(state)
    if isinstance(state, dict):
        out = {k: blank_like(v) for k, v in state.items()}
        if "embed" in state and "head" in state and state["embed"] is state["head"]:
            out["head"] = out["embed"]
        if "row" in out:
            out["row"] = torch.zeros(64, 32)[3]  # a view inside a larger storage, saved as one
            out["b"] = torch.zeros(3, 64)[1]  # a view inside a larger storage, saved as a whole one
        if "t" in out:
            out["t"] = torch.zeros(8, 16).t()  # not contiguous
        return out
    if isinstance(state, list):
        return [blank_like(v) for v in state]
    return state


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.fixture
def reads(monkeypatch):
    """How each torch-format file was read: 'placed' (straight into the destination) or 'buffered';
    reads.into: the destination tensors each placed read filled."""
    seen = Reads()
    real_placed, real_buffered = torch_format._read_placed, torch_format.read_records

    def placed(path, order, targets, *rest):
        seen.append("placed")
        seen.into.append(list(targets.values()))
        return real_placed(path, order, targets, *rest)
    monkeypatch.setattr(torch_format, "_read_placed", placed)
    monkeypatch.setattr(torch_format, "read_records", lambda *a: seen.append("buffered") or real_buffered(*a))
    return seen


class Reads(list):
    def __init__(self) -> None:
        super().__init__()
        self.into: list = []


def filled(tensors: list, within: list) -> bool:
    """Whether exactly the tensors of `within` (by identity) were filled."""
    return sorted(map(id, tensors)) == sorted(map(id, within))


def test_tensors_that_are_their_whole_storage_are_read_in_place_the_rest_copied(tmp_path, reads):
    with fastckpt.Checkpointer(tmp_path) as ck:
        ck.save(saved_state(1), step=1).wait()
    into = blank_like(saved_state(1))
    ptrs = {k: v.data_ptr() for k, v in into["model"].items()}
    out = fastckpt.Checkpointer(tmp_path).load(into=into)
    assert out is into and reads == ["placed"]
    m = into["model"]  # read in place: each tensor that is its whole storage (a tie once); copied: the views
    assert filled(reads.into[0], [m["w"], m["half"], m["embed"], into["opt"]["state"][0]["exp_avg"],
                                  into["opt"]["state"][0]["step"]])
    assert same(into, saved_state(1) | {"step": 1})
    assert into["model"]["head"] is into["model"]["embed"]
    assert {k: v.data_ptr() for k, v in into["model"].items()} == ptrs
    assert same(fastckpt.Checkpointer(tmp_path).load(), saved_state(1))  # a plain load still its own memory


def test_one_part_by_key_and_an_unverified_load_read_in_place(tmp_path, reads):
    with fastckpt.Checkpointer(tmp_path) as ck:
        ck.save(saved_state(2), step=2).wait()
    model = blank_like(saved_state(2)["model"])
    fastckpt.Checkpointer(tmp_path).load(into=model, key="model")
    assert same(model, saved_state(2)["model"])
    model = blank_like(saved_state(2)["model"])
    fastckpt.Checkpointer(tmp_path).load(into=model, key="model", verify=False)
    assert same(model, saved_state(2)["model"]) and reads == ["placed", "placed"]


def test_a_structure_that_differs_is_refused_before_any_byte_is_written(tmp_path, reads):
    with fastckpt.Checkpointer(tmp_path) as ck:
        ck.save(saved_state(3), step=3).wait()
    into = blank_like(saved_state(3))
    into["model"]["extra"] = torch.zeros(4)
    with pytest.raises(fastckpt.StateMismatchError, match=r"model\.extra: missing from the checkpoint"):
        fastckpt.Checkpointer(tmp_path).load(into=into)
    assert not any(bool(v.any()) for v in into["model"].values() if isinstance(v, torch.Tensor) and v.numel())
    into = blank_like(saved_state(3))
    into["model"]["w"] = torch.zeros(128, 65)
    with pytest.raises(fastckpt.StateMismatchError, match=r"model\.w: checkpoint has"):
        fastckpt.Checkpointer(tmp_path).load(into=into)
    assert not into["model"]["b"].any() and not into["opt"]["state"][0]["exp_avg"].any()
    assert reads == ["buffered", "buffered"]  # nothing placed: the load's own check named the difference


def test_a_corrupt_newest_checkpoint_passed_over_leaves_the_older_ones_values(tmp_path, reads):
    with fastckpt.Checkpointer(tmp_path, keep=2) as ck:
        ck.save(saved_state(4), step=4).wait()
        info = ck.save(saved_state(5), step=5).wait()
    with open(info.file_for(0), "r+b") as f:  # a bit flipped in the middle of the largest record
        size = os.path.getsize(info.file_for(0))
        f.seek(size // 2)
        b = f.read(1)
        f.seek(size // 2)
        f.write(bytes([b[0] ^ 0x04]))
    into = blank_like(saved_state(4))
    with pytest.warns(UserWarning, match="corrupt"):
        fastckpt.Checkpointer(tmp_path).load(into=into)
    assert same(into, saved_state(4)) and reads == ["placed", "placed"]


def test_a_load_to_another_device_or_of_another_format_copies(tmp_path, reads):
    with fastckpt.Checkpointer(tmp_path / "st", format="safetensors") as ck:
        ck.save(saved_state(6), step=6).wait()
    into = blank_like(saved_state(6))
    fastckpt.Checkpointer(tmp_path / "st").load(into=into)
    assert same(into, saved_state(6))
    with fastckpt.Checkpointer(tmp_path / "pt") as ck:
        ck.save(saved_state(7), step=7).wait()
    into = blank_like(saved_state(7))
    fastckpt.Checkpointer(tmp_path / "pt").load(into=into, map_location=None)
    assert same(into, saved_state(7)) and reads == ["buffered"]


def test_a_destination_tied_where_the_file_is_not_is_copied(tmp_path, reads):
    """The file holds [s1, s2, s1] (its first and last the same tensor); the destination [a, a, z]
    ties its first two. a's memory is filled from two stored tensors: read into it in place, s2's
    copy would land before z's copy of s1 out of it. a is copied (z is read in place), and z holds s1."""
    g = torch.Generator().manual_seed(8)
    s1, s2 = torch.randn(64, generator=g), torch.randn(64, generator=g)
    with fastckpt.Checkpointer(tmp_path) as ck:
        ck.save({"p": [s1, s2, s1]}, step=8).wait()
    a, z = torch.zeros(64), torch.zeros(64)
    fastckpt.Checkpointer(tmp_path).load(into={"p": [a, a, z]})
    assert torch.equal(z, s1) and (torch.equal(a, s1) or torch.equal(a, s2))
    assert reads == ["placed"] and filled(reads.into[0], [z])


def test_a_trusted_load_into_reads_the_usual_way(tmp_path, reads):
    """weights_only=False (a pickle that may run code): its structure is not parsed a second time
    to place tensors; it loads and is copied as before."""
    import argparse
    with fastckpt.Checkpointer(tmp_path) as ck:
        ck.save({"model": {"w": torch.ones(8)}, "args": argparse.Namespace(lr=0.5)}, step=9).wait()
    w = torch.zeros(8)
    fastckpt.Checkpointer(tmp_path).load(into={"w": w}, key="model", weights_only=False)
    assert torch.equal(w, torch.ones(8)) and reads == ["buffered"]
