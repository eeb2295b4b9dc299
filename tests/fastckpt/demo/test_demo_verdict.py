"""The demo's verdict and the digest it takes of each saved state: the exit status fails only
for what fastckpt owns (the checkpoint against the state it was given, or a resume that ends
elsewhere although training is shown reproducible); a machine whose training does not repeat is
said in one line, not blamed on the checkpoint. The run itself: tests/project/test_first_hour.py."""
from __future__ import annotations

import pytest
import torch

from fastckpt.demo.__main__ import verdict
from fastckpt.demo.digest import record_saved, saved_digests, state_digest


def test_both_yes():
    lines, failed = verdict((120, "aa", "aa"), "w1", "w1", None)
    assert lines == ["checkpoint at step 120 equals the state saved: YES",
                     "resumed model bit-identical to the uninterrupted run: YES"] and not failed


def test_training_that_does_not_repeat_is_said_and_is_not_a_failure():
    lines, failed = verdict((120, "aa", "aa"), "w1", "w2", "w3")
    assert lines[0] == "checkpoint at step 120 equals the state saved: YES" and not failed
    assert lines[1].startswith("resumed model bit-identical to the uninterrupted run: NO, and not the checkpoint's "
                               "doing: training on this machine is not reproducible")
    assert "w1 and w3" in lines[1] and len(lines) == 2


def test_a_checkpoint_that_is_not_the_state_saved_fails_whatever_training_did():
    for final, again in (("w1", None), ("w2", "w3")):
        lines, failed = verdict((120, "bb", "aa"), "w1", final, again)
        assert lines[0] == "checkpoint at step 120 equals the state saved: NO (saved aa, loaded bb)" and failed


def test_a_resume_that_ends_elsewhere_while_training_repeats_fails():
    lines, failed = verdict((120, "aa", "aa"), "w1", "w2", "w1")
    assert failed and lines[1] == ("resumed model bit-identical to the uninterrupted run: NO (weights w2; the "
                                   "uninterrupted run ended with w1, twice)")


def test_a_checkpoint_the_killed_run_did_not_save_is_said_and_is_no_failure():
    lines, failed = verdict((130, "aa", None), "w1", "w1", None)
    assert lines[0].startswith("checkpoint at step 130 equals the state saved: not known (the killed run recorded "
                               "no save at that step") and not failed


def test_no_checkpoint_after_saves_were_issued_fails_and_none_owed_does_not():
    lines, failed = verdict(None, "w1", "w2", None, issued=True)
    assert failed and "found none committed" in lines[0]
    lines, failed = verdict(None, "w1", "w1", None, issued=False)
    assert not failed and lines == ["no checkpoint to resume from: the kill came before the first save "
                                    "(demo.kill_at < demo.every)"]


def test_the_state_digest_sees_every_bit_and_not_the_order_of_keys():
    state = {"model": {"w": torch.arange(6.0).reshape(2, 3), "h": torch.ones(3, dtype=torch.bfloat16)},
             "optimizer": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
             "rng": torch.get_rng_state(), "step": 120}
    d = state_digest(state)
    reordered = dict(reversed(list(state.items())))
    assert state_digest(reordered) == d
    flipped = {**state, "model": {**state["model"], "w": state["model"]["w"].clone()}}
    flipped["model"]["w"].view(torch.int32)[1, 2] ^= 1  # one bit
    assert state_digest(flipped) != d
    assert state_digest({**state, "step": 121}) != d
    assert state_digest({**state, "model": {**state["model"], "h": state["model"]["h"].float()}}) != d  # dtype
    assert state_digest({**state, "model": {**state["model"], "w": state["model"]["w"].reshape(3, 2)}}) != d  # shape


def test_saved_digests_survive_as_written_and_a_torn_line_is_skipped(tmp_path):
    path = str(tmp_path / "saved.jsonl")
    assert saved_digests(path) == {}
    record_saved(path, 10, {"w": torch.zeros(2)})
    record_saved(path, 20, {"w": torch.ones(2)})
    with open(path, "a") as f:
        f.write('{"step": 30, "dig')  # the kill cut the last line short
    assert saved_digests(path) == {10: state_digest({"w": torch.zeros(2)}), 20: state_digest({"w": torch.ones(2)})}


def test_the_state_digest_refuses_what_it_cannot_digest_exactly():
    with pytest.raises(TypeError, match="not set"):
        state_digest({"names": {"a", "b"}})
