"""fastckpt.named.NamedCheckpoints on its own (both plugins' suites drive it through Lightning
and DeepSpeed): saves by path, a load of a path in flight waits for it, removal never deletes
the only valid checkpoint (also across a reconfigure), sizes, settings checked up front."""
from __future__ import annotations

import os

import pytest
import torch

from fastckpt.errors import ConfigError
from fastckpt.named import NamedCheckpoints


def state(v: float) -> dict:
    return {"w": torch.full((1024,), v), "step": int(v)}


def test_save_load_and_size_by_path(tmp_path):
    named = NamedCheckpoints.by_path({"concurrency": 2})
    a = str(tmp_path / "sub" / "a.ckpt")  # its folder is made
    pending = named.save(state(1.0), a, step=1, held=True)
    assert not pending.done() and named.pending(a) is pending
    got = named.load(a)  # waits for (and releases) the save in flight
    assert torch.equal(got["w"], state(1.0)["w"]) and got["step"] == 1
    assert named.size(a) == os.path.getsize(a)
    assert named.size(str(tmp_path / "absent.ckpt")) is None
    with pytest.raises(FileNotFoundError, match="Checkpoint file not found"):
        named.load(str(tmp_path / "absent.ckpt"))
    named.close()


def test_a_removal_waits_for_a_newer_commit_even_across_a_reconfigure(tmp_path):
    named = NamedCheckpoints.by_path({"concurrency": 2})
    a, b = str(tmp_path / "a.ckpt"), str(tmp_path / "b.ckpt")
    named.save(state(1.0), a, step=1).wait()
    named.reconfigure(concurrency=1, writers=2)  # the tuner's N*, p*: a stays tracked
    assert named.settings["concurrency"] == 1 and not named.opened
    held = named.save(state(2.0), b, step=2, held=True)
    named.remove(a)  # b has not landed: a is the only valid checkpoint
    assert os.path.exists(a)
    held.release_all()
    held.wait()
    named.remove_deferred()
    assert not os.path.exists(a) and os.path.exists(b)
    named.remove(str(tmp_path / "foreign.ckpt"))  # never saved here: removed at once (nothing there)
    named.close()


def test_saving_a_path_again_cancels_its_pending_removal(tmp_path):
    named = NamedCheckpoints.by_path({})
    a, b = str(tmp_path / "a.ckpt"), str(tmp_path / "b.ckpt")
    named.save(state(1.0), a, step=1).wait()
    held = named.save(state(2.0), b, step=2, held=True)
    named.remove(a)
    again = named.save(state(3.0), a, step=3)
    held.release_all()  # commits land in save order: b first
    again.wait()
    named.close()
    assert named.load(a)["step"] == 3 and named.load(b)["step"] == 2


def test_bad_settings_are_refused_before_anything_opens():
    with pytest.raises(ConfigError):
        NamedCheckpoints.by_path({"concurrency": 0})
    named = NamedCheckpoints.by_path({})
    before = named.config
    with pytest.raises(ConfigError):
        named.reconfigure(writers=-1)
    assert named.config is before and not named.opened


def test_reconfigure_changes_how_checkpoints_are_written_never_where(tmp_path):
    """The tuner's concurrency / writers, yes; a placement field, the memory tier's included, no:
    where checkpoints live was decided where the settings entered."""
    named = NamedCheckpoints.by_path({"concurrency": 2})
    for change in ({"tiers": ["/dev/shm/elsewhere"]}, {"tier_keep": [3]}, {"root": str(tmp_path)}):
        with pytest.raises(ConfigError, match="not settings here"):
            named.reconfigure(**change)
    assert named.config.tiers is None and named.config.store == "path"
    named.close()


@pytest.mark.parametrize("tiers", ["/dev/shm/run7", 7])
def test_tiers_that_are_not_a_list_of_paths_are_refused_in_one_line(tiers):
    with pytest.raises(ConfigError, match="tiers is a list of paths"):
        NamedCheckpoints.by_path({"tiers": tiers})

