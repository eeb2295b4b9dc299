"""DeepSpeed: the "fastckpt" config entry selects FastckptEngine; save/resume is bit-exact
for ZeRO 0-3; a missing, torn or wrong `latest` never loads an incomplete tag; bad config
is a clear error. Real deepspeed.initialize engines (CPU accelerator, gloo), each in its own
process."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch

pytest.importorskip("deepspeed")
HERE = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(mode: str, save_dir, out, *extra: str, **env_extra: str) -> dict:
    env = dict(os.environ, MASTER_PORT=str(free_port()), DS_ACCELERATOR="cpu", PYTHONPATH=HERE, **env_extra)
    r = subprocess.run([sys.executable, os.path.join(HERE, "ds_worker.py"), mode, str(save_dir), str(out), *extra],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return torch.load(out, weights_only=False)


def assert_resumed_exactly(trained: dict, resumed: dict) -> None:
    assert resumed["engine"] == "FastckptEngine"
    assert resumed["client"] == {"data_pos": 3, "note": "three steps"}
    assert resumed["losses"] == trained["losses"]  # same next steps: model, optimizer and lr restored
    assert resumed["global_steps"] == trained["global_steps"]
    for a, b in zip(trained["params"], resumed["params"]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("stage,dtype", [(0, "fp32"), (1, "fp32"), (2, "bf16"), (3, "fp32")])
def test_resume_is_bit_exact_for_every_zero_stage(tmp_path, stage, dtype):
    trained = run("train", tmp_path / "ck", tmp_path / "a.pt", "--stage", str(stage), "--dtype", dtype)
    assert trained["engine"] == "FastckptEngine"
    assert os.path.isfile(tmp_path / "ck" / "global_step3" / "fastckpt-tag.json")
    resumed = run("resume", tmp_path / "ck", tmp_path / "b.pt", "--stage", str(stage), "--dtype", dtype)
    assert_resumed_exactly(trained, resumed)


@pytest.mark.parametrize("latest", ["missing", "torn", "uncommitted"])
def test_latest_file_is_not_trusted(tmp_path, latest):
    trained = run("train", tmp_path / "ck", tmp_path / "a.pt", "--stage", "1")
    resumed = run("resume", tmp_path / "ck", tmp_path / "b.pt", "--stage", "1", "--latest", latest)
    assert resumed["path"].endswith(os.path.join("global_step3", "mp_rank_00_model_states.pt"))
    assert_resumed_exactly(trained, resumed)


def test_a_script_that_never_calls_destroy_still_commits_its_last_tag(tmp_path):
    trained = run("train", tmp_path / "ck", tmp_path / "a.pt", "--stage", "1", EXIT_WITHOUT_DESTROY="1")
    assert os.path.isfile(tmp_path / "ck" / "global_step3" / "fastckpt-tag.json")
    assert_resumed_exactly(trained, run("resume", tmp_path / "ck", tmp_path / "b.pt", "--stage", "1"))


def test_files_are_what_torch_load_reads(tmp_path):
    run("train", tmp_path / "ck", tmp_path / "a.pt", "--stage", "2")
    sd = torch.load(tmp_path / "ck" / "global_step3" / "mp_rank_00_model_states.pt", weights_only=False)
    assert "module" in sd and sd["global_steps"] == 3
    optim = torch.load(tmp_path / "ck" / "global_step3" / "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                       weights_only=False)
    assert "optimizer_state_dict" in optim


def test_unknown_key_in_the_entry_is_a_clear_error(tmp_path):
    got = run("config-error", tmp_path, tmp_path / "e.pt")
    assert "ConfigError" in got["error"] and "bogus_key" in got["error"] and "concurrency" in got["error"]
