"""DeepSpeed: the "fastckpt" config entry selects FastckptEngine; save/resume is bit-exact
for ZeRO 0-3, on one rank and on two, and after kill -9 of both ranks at any moment; what
we write is what DeepSpeed's zero_to_fp32 consolidates; a missing, torn or wrong `latest`
never loads an incomplete tag; bad config is a clear error. Real deepspeed.initialize
engines (CPU accelerator, gloo), each rank its own process."""
from __future__ import annotations

import json
import os
import random
import signal
import sys
import time

import pytest
import torch

pytest.importorskip("deepspeed")
from support import warm
from support.deepspeed_runs import assert_resumed_exactly, launch, run
from support.paths import ROOT, python_path

from deepspeed_fastckpt.tag_records import read_record


@pytest.mark.parametrize("stage,dtype", [(0, "fp32"), (1, "fp32"), (2, "bf16"), (3, "fp32")])
def test_resume_is_bit_exact_for_every_zero_stage(tmp_path, stage, dtype):
    trained = run("train", tmp_path / "ck", tmp_path / "a.pt", "--stage", str(stage), "--dtype", dtype)
    assert trained["engine"] == "FastckptEngine"
    assert os.path.isfile(tmp_path / "ck" / "global_step3" / "COMMIT")
    resumed = run("resume", tmp_path / "ck", tmp_path / "b.pt", "--stage", str(stage), "--dtype", dtype)
    assert_resumed_exactly(trained, resumed)


@pytest.mark.parametrize("stage", [2, 3])
def test_two_ranks_resume_bit_exact_and_zero_to_fp32_consolidates_what_we_wrote(tmp_path, stage):
    trained = run("train", tmp_path / "ck", tmp_path / "a.pt", "--stage", str(stage), ranks=2)
    record = read_record(str(tmp_path / "ck"), "global_step3")
    assert record.world_size == 2
    assert {("zero_pp_rank_0_mp_rank_00_optim_states.pt", 0), ("zero_pp_rank_1_mp_rank_00_optim_states.pt", 1)} <= \
        {(f.name, f.rank) for f in record.files}  # both ranks' partitions, committed together
    resumed = run("resume", tmp_path / "ck", tmp_path / "b.pt", "--stage", str(stage), ranks=2)
    assert_resumed_exactly(trained, resumed)
    merged = run("consolidate", tmp_path / "ck", tmp_path / "c.pt", "--tag", "global_step3")
    assert merged.keys() == trained["params_at_save"].keys()
    for name, value in trained["params_at_save"].items():
        assert torch.equal(merged[name].float(), value), name


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_resume_after_kill_9_of_both_ranks_is_bit_exact(tmp_path, stage):
    """Both ranks checkpoint every step and are SIGKILLed at a random moment (a save in flight,
    a commit half-done); the newest committed tag loads and training continues exactly as a
    run that never stopped."""
    save_dir, width, zero = tmp_path / "ck", {"WIDTH": "512"}, ("--stage", str(stage))
    procs = launch("loop", save_dir, tmp_path / "x.pt", *zero, "--steps", "400", ranks=2, **width)
    latest = save_dir / "fastckpt-latest"
    deadline = time.monotonic() + 300
    while not (latest.exists() and int(latest.read_text().removeprefix("global_step") or 0) >= 4):
        assert all(p.poll() is None for p in procs), "a rank ended before the kill: " + procs[0].communicate()[0][-4000:]
        assert time.monotonic() < deadline, "no tag committed in 300 s"
        time.sleep(0.01)
    time.sleep(random.uniform(0.0, 0.3))
    assert all(p.poll() is None for p in procs), "a rank ended before the kill"
    for p in procs:
        p.send_signal(signal.SIGKILL)
    for p in procs:
        p.communicate()
    resumed = run("resume", save_dir, tmp_path / "b.pt", *zero, ranks=2, **width)
    done = resumed["loaded_steps"]
    assert done >= 4 and resumed["client"] == {"data_pos": done, "note": "loop"}
    ref = run("reference", tmp_path / "unused", tmp_path / "r.pt", *zero, "--steps", str(done + 2),
              ranks=2, **width)
    assert resumed["losses"] == ref["losses"][done:done + 2]
    for name, value in ref["params_after"][done + 1].items():
        assert torch.equal(value, resumed["params"][name]), name


@pytest.mark.parametrize("stage", [1, 3])
def test_tags_into_a_pmem_pool_resume_bit_exact_on_two_ranks(tmp_path, shm, stage):
    """"pool" in the entry: every file of a tag is a model of a persistent-memory pool named by
    its path (on disk only a small pointer file), the tag record stays in save_dir; resume reads
    them back out of the pool."""
    pool = os.path.join(shm, "ds.pool")
    entry = json.dumps({"pool": pool, "pool_mb": 64, "concurrency": 2})
    trained = run("train", tmp_path / "ck", tmp_path / "a.pt", "--stage", str(stage), ranks=2,
                  FASTCKPT_ENTRY=entry)
    tag_dir = tmp_path / "ck" / "global_step3"
    sizes = {f: os.path.getsize(tag_dir / f) for f in os.listdir(tag_dir) if f != "COMMIT"}
    assert sizes and max(sizes.values()) < 1024, sizes  # pointers: the data lives in the pool
    resumed = run("resume", tmp_path / "ck", tmp_path / "b.pt", "--stage", str(stage), ranks=2,
                  FASTCKPT_ENTRY=entry)
    assert_resumed_exactly(trained, resumed)
    out = tmp_path / "model_states.pt"  # a pool model exported is an ordinary DeepSpeed file
    model = str(tag_dir / ("zero_pp_rank_0_mp_rank_00_model_states.pt" if stage == 3 else "mp_rank_00_model_states.pt"))
    assert warm.run([sys.executable, "-m", "fastckpt.tools.cli", "export", pool, str(out), "--model", model,
                     "--to", "torch"], env=dict(os.environ, PYTHONPATH=python_path(ROOT))).returncode == 0
    assert "module" in torch.load(out, weights_only=False)


def tensors_of(obj, prefix=""):
    """Every tensor in a loaded checkpoint, by its path in the nesting."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from tensors_of(v, f"{prefix}/{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from tensors_of(v, f"{prefix}/{i}")


@pytest.mark.parametrize("stage", [2, 3])
def test_each_tag_is_one_step_exactly_and_the_gate_is_per_group(tmp_path, stage, fault_shim):
    """Each save is issued between backward and the update, so the update meets a ~150 MB
    snapshot still being copied: an update not gated on its group's copy would leave values of
    two steps in the tag. Every tag must equal the default engine's tag of the same step,
    tensor for tensor, and DeepSpeed's two parameter groups must be gated one by one. The
    writes are slowed (20 ms per write: the LD_PRELOAD shim) so that the snapshot is surely
    still in flight when the update comes, however long ZeRO-3's work before the update takes."""
    env = {"WIDTH": "3072", "HIDDEN": "1"}
    args = ("--stage", str(stage), "--steps", "4", "--save-before-update")
    run("loop", tmp_path / "ref", tmp_path / "r.pt", *args, "--engine", "torch", **env)
    slow = {"LD_PRELOAD": fault_shim, "FASTCKPT_FAULT_PATH": str(tmp_path / "fast"), "FASTCKPT_FAULT_SLOW_US": "20000"}
    got = run("loop", tmp_path / "fast", tmp_path / "f.pt", *args,
              FASTCKPT_ENTRY='{"concurrency": 2, "chunk_mb": 4, "staging_mb": 4}', **env, **slow)
    assert got["gate"]["scoped"] and got["gate"]["full_waits"] == 0
    assert got["gate"]["scoped_waits"] >= 1  # an update met a copy in flight (most of steps 1-3 do)
    for tag in ("global_step0", "global_step1", "global_step2", "global_step3"):
        names = sorted(n for n in os.listdir(tmp_path / "ref" / tag) if n.endswith(".pt"))
        assert names == sorted(n for n in os.listdir(tmp_path / "fast" / tag) if n.endswith(".pt"))
        for name in names:
            ref = dict(tensors_of(torch.load(tmp_path / "ref" / tag / name, weights_only=False)))
            fast = dict(tensors_of(torch.load(tmp_path / "fast" / tag / name, weights_only=False)))
            assert ref.keys() == fast.keys(), (tag, name)
            for key, value in ref.items():
                assert torch.equal(value, fast[key]), (tag, name, key)


@pytest.mark.parametrize("latest", ["missing", "torn", "uncommitted"])
def test_latest_file_is_not_trusted(tmp_path, latest):
    trained = run("train", tmp_path / "ck", tmp_path / "a.pt", "--stage", "1")
    resumed = run("resume", tmp_path / "ck", tmp_path / "b.pt", "--stage", "1", "--latest", latest)
    assert resumed["path"].endswith(os.path.join("global_step3", "mp_rank_00_model_states.pt"))
    assert_resumed_exactly(trained, resumed)


def test_a_script_that_never_calls_destroy_still_commits_its_last_tag(tmp_path):
    trained = run("train", tmp_path / "ck", tmp_path / "a.pt", "--stage", "1", EXIT_WITHOUT_DESTROY="1")
    assert os.path.isfile(tmp_path / "ck" / "global_step3" / "COMMIT")
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


def test_an_s3_save_dir_is_refused_in_one_line_and_no_local_folder_is_made(tmp_path):
    """DeepSpeed writes its tag folders and `latest` with local file calls: save_checkpoint("s3://...")
    would make a local folder `s3:`; the entry refuses it on every rank (DeepSpeed makes save_dir on
    rank 0 alone, then waits in a barrier) before anything is written."""
    (tmp_path / "cwd").mkdir()
    got = run("url-save-dir", tmp_path / "cwd", tmp_path / "e.pt", ranks=2, timeout=120)
    assert got["error"].startswith("ConfigError: ") and "s3://ckpt/run7" in got["error"], got
    assert "\n" not in got["error"] and got["made"] == [], got
    assert got["every_rank"] == [got["error"]] * 2, got


def test_lightning_deepspeed_strategy_selects_fastckpt_and_resumes_exactly(tmp_path):
    """Trainer(strategy=DeepSpeedStrategy(config={..., "fastckpt": {...}})) with ModelCheckpoint:
    the tags are fastckpt's, resuming from the step-4 checkpoint reaches the same step-8
    parameters, and save_top_k=1 with a save every step keeps exactly the newest."""
    lit = dict(script="ds_lightning_worker.py")
    full = run("fit", tmp_path / "a", tmp_path / "a.pt", "--steps", "8", "--every", "4", **lit)
    assert full["engine"] == "FastckptEngine"
    assert full["files"] == ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt"]
    assert os.path.isfile(tmp_path / "a" / "epoch=0-step=4.ckpt" / "checkpoint" / "COMMIT")
    resumed = run("resume", tmp_path / "a", tmp_path / "b.pt", "--steps", "8", "--from", "epoch=0-step=4.ckpt", **lit)
    assert resumed["global_step"] == 8
    for name, value in full["params"].items():
        assert torch.equal(value, resumed["params"][name]), name
    kept = run("fit", tmp_path / "c", tmp_path / "c.pt", "--steps", "12", "--every", "1", "--top-k", "1", **lit)
    assert kept["files"] == ["epoch=2-step=12.ckpt"]


def test_lightning_top_k_removes_a_checkpoint_still_in_flight_once_it_lands(tmp_path, fault_shim):
    """save_top_k=1 with a save every step, and the writes of step 5's model file held until fit has
    returned (the LD_PRELOAD shim; the worker lets them go then), so that tag is still landing
    whatever the training speed: ModelCheckpoint removes step 5's directory right after issuing
    step 6's save. The removal must not fail the tag or Lightning's delete: the directory is
    still there when fit returns (its save in flight), gone after destroy, and the newest
    checkpoint is committed and resumes."""
    # only the model file's writes are held (fastckpt writes it as a hidden sibling, renamed when
    # written): DeepSpeed's own 'latest' file there is written by the training thread itself. Each
    # file of a tag takes a slot: 4 let step 6's two files start while step 5's are held
    held = tmp_path / "c" / "epoch=1-step=5.ckpt" / "checkpoint" / ".mp_rank_00_model_states.pt.fastckpt-"
    slow = {"LD_PRELOAD": fault_shim, "FASTCKPT_FAULT_PATH": str(held),
            "FASTCKPT_FAULT_HOLD": str(tmp_path / "fit-returned")}
    lit = dict(script="ds_lightning_worker.py")
    kept = run("fit", tmp_path / "c", tmp_path / "c.pt", "--steps", "6", "--every", "1", "--top-k", "1",
               "--concurrency", "4", **lit, **slow)
    assert "epoch=1-step=5.ckpt" in kept["files_before_destroy"]  # removed while in flight: deferred
    assert kept["files"] == ["epoch=1-step=6.ckpt"]
    assert os.path.isfile(tmp_path / "c" / "epoch=1-step=6.ckpt" / "checkpoint" / "COMMIT")
    resumed = run("resume", tmp_path / "c", tmp_path / "d.pt", "--steps", "6", "--from", "epoch=1-step=6.ckpt", **lit)
    assert resumed["global_step"] == 6
    for name, value in kept["params"].items():
        assert torch.equal(value, resumed["params"][name]), name


@pytest.mark.parametrize("stage,how", [(1, "entry"), (3, "entry"), (2, "helper")])
def test_activation_offload_trains_bit_equal_to_the_run_without_it(tmp_path, stage, how):
    """The engine's saved activations go to files in forward and come back for backward, each
    with the shape, strides and dtype it was saved with: every loss and every parameter after
    every step equals the run without offload, bit for bit; no file is left behind. Under
    ZeRO 1 and 2 Linear saves weight.t(), a view of a parameter: it stays in memory (writing it
    frees nothing), and were it written it would have to come back transposed."""
    act = tmp_path / "act"
    act.mkdir()
    extra = dict(WIDTH="256", HIDDEN="1")
    plain = run("reference", tmp_path / "u", tmp_path / "p.pt", "--stage", str(stage), "--steps", "4", **extra)
    if how == "entry":
        entry = json.dumps({"offload": {"directory": str(act), "threshold_mb": 0.001, "aware": "wr"}})
        got = run("reference", tmp_path / "u", tmp_path / "o.pt", "--stage", str(stage), "--steps", "4",
                  FASTCKPT_ENTRY=entry, WATCH_LAYOUT="1", **extra)
    else:
        got = run("reference", tmp_path / "u", tmp_path / "o.pt", "--stage", str(stage), "--steps", "4",
                  "--engine", "torch", OFFLOAD_HELPER=str(act), WATCH_LAYOUT="1", **extra)
    assert got["offload"]["offloaded"] >= 4 * 2 and got["offload"]["shared"] >= 4
    if stage < 3:  # ZeRO-3 saves the gathered parameter itself, never a view of it
        assert got["offload"]["kept_alive_elsewhere"] >= 4
    assert got["layout"]["checked"] >= 4 * 2 and got["layout"]["mismatches"] == []
    assert got["losses"] == plain["losses"]
    for before, after in zip(plain["params_after"], got["params_after"]):
        for name in before:
            assert torch.equal(before[name], after[name]), name
    assert os.listdir(act) == []


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_transformer_block_gets_every_saved_tensor_back_in_its_layout_and_trains_bit_equal(tmp_path, stage):
    """Attention saves transposed and permuted activations (q, k, v split by view + transpose),
    LayerNorm and Linear their own: through the DeepSpeed entry's offload, every tensor autograd
    gets back has the shape, strides, dtype and device it saved, and training equals the run
    without offload bit for bit."""
    act = tmp_path / "act"
    act.mkdir()
    extra = dict(MODEL="block", WIDTH="64")
    plain = run("reference", tmp_path / "u", tmp_path / "p.pt", "--stage", str(stage), "--steps", "3", **extra)
    entry = json.dumps({"offload": {"directory": str(act), "threshold_mb": 0.001, "mode": "tool", "tool": "posix"}})
    got = run("reference", tmp_path / "u", tmp_path / "o.pt", "--stage", str(stage), "--steps", "3",
              FASTCKPT_ENTRY=entry, WATCH_LAYOUT="1", **extra)
    assert got["layout"]["mismatches"] == []
    assert got["layout"]["checked"] >= 3 * 8  # each step: the block's activations, transposed ones among them
    assert got["losses"] == plain["losses"]
    for before, after in zip(plain["params_after"], got["params_after"]):
        for name in before:
            assert torch.equal(before[name], after[name]), name
    assert os.listdir(act) == []


def test_unknown_offload_setting_in_the_entry_is_a_clear_error():
    from deepspeed_fastckpt.settings import checkpointer_config
    from fastckpt.errors import ConfigError
    with pytest.raises(ConfigError, match=r"unknown offload setting\(s\) \['treshold_mb'\]"):
        checkpointer_config({"concurrency": 2, "offload": {"treshold_mb": 1}})
    config, pool = checkpointer_config({"concurrency": 2, "offload": {"threshold_mb": 1}})
    assert config.concurrency == 2 and config.store == "path" and pool is None


def test_interval_auto_is_tuned_once_and_agreed_by_both_ranks(tmp_path):
    """"interval": "auto": after the warm-up each rank profiles N x p, the engine is reconfigured
    to N*, and both ranks save at the same steps (the agreed interval); the tags commit."""
    entry = json.dumps({"interval": "auto", "tune": {"overhead": 0.5, "warmup_steps": 3, "ns": [1, 2], "ps": [1],
                                                     "drift": 100}})
    got = run("auto-interval", tmp_path / "ck", tmp_path / "a.pt", "--stage", "1", "--steps", "16", ranks=2,
              FASTCKPT_ENTRY=entry)
    every = got["interval"]
    assert every >= got["plan"]["interval"] >= 1 and got["concurrency"] == got["plan"]["concurrency"]
    assert got["saved_at"] and all(s % every == 0 for s in got["saved_at"]) and min(got["saved_at"]) > 3
    tags = sorted(d for d in os.listdir(tmp_path / "ck") if d.startswith("global_step"))
    assert tags == sorted(f"global_step{s}" for s in got["saved_at"])
    for t in tags:
        assert (tmp_path / "ck" / t / "COMMIT").exists()
    assert {"fastckpt-tune-rank0.json", "fastckpt-tune-rank1.json"} <= set(os.listdir(tmp_path / "ck"))


def test_bad_interval_settings_are_clear_errors():
    from deepspeed_fastckpt.settings import checkpointer_config
    from fastckpt.errors import ConfigError
    with pytest.raises(ConfigError, match='"interval" in the "fastckpt" entry is "auto" or a positive integer'):
        checkpointer_config({"interval": "often"})
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['overhed'\] in \"tune\""):
        checkpointer_config({"interval": "auto", "tune": {"overhed": 0.1}})
    with pytest.raises(ConfigError, match='needs "interval": "auto"'):
        checkpointer_config({"tune": {"overhead": 0.1}})
    config, pool = checkpointer_config({"interval": 5, "concurrency": 2})  # not a Checkpointer setting
    assert config.concurrency == 2 and pool is None
