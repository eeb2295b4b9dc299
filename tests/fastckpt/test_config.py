"""Hydra groups and overrides build the Checkpointer; bad values give clear errors."""
from __future__ import annotations

import os

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import MissingConfigException

import fastckpt
from fastckpt.config import CheckpointerConfig, flatten
from fastckpt.config.hydra import instantiate

from support import warm
from support.paths import CONFIGS, ROOT


def make(overrides):
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        return compose(config_name="config", overrides=overrides)


def test_defaults(tmp_path):
    cfg = make([f"root={tmp_path}"])
    ck = instantiate(cfg)
    assert (ck.strategy, ck.concurrency, ck.writers, ck.chunk_mb) == ("c", 2, 4, 64)
    ck.close()


@pytest.mark.parametrize("overrides,expect", [
    (["strategy=d"], ("d", 2)),
    (["strategy=g", "strategy.concurrency=4"], ("g", 4)),
    (["strategy=c", "concurrency=3"], ("c", 3)),
])
def test_overrides(tmp_path, overrides, expect):
    ck = instantiate(make([f"root={tmp_path}"] + overrides))
    assert (ck.strategy, ck.concurrency) == expect
    ck.close()


def test_tiers_replicas_and_the_preemption_signal_from_hydra_overrides(tmp_path, shm):
    memory, disk = os.path.join(shm, "run"), str(tmp_path / "disk")
    ck = instantiate(make([f"tiers=[{memory},{disk}]", "tier_keep=[1,3]", "replicas=1", "preempt_signal=SIGTERM",
                           "preempt_grace_s=45", "persist_every=4"]))
    try:
        c = ck.config
        assert (c.tiers, c.root, c.tier_keep, c.replicas, c.persist_every) == ((memory, disk), disk, (1, 3), 1, 4)
        assert (c.preempt_signal, c.preempt_grace_s) == (15, 45)
        assert ck.save({"w": torch.ones(3)}, 1).wait().step == 1
        assert ck.store.holding()[1][0] == memory  # committed on the memory tier first
    finally:
        ck.close()


def test_unknown_group_value_is_hydras_error():
    with pytest.raises(MissingConfigException, match="strategy"):
        make(["strategy=zz"])


def test_unknown_keys_are_clear_errors(tmp_path):
    with pytest.raises(fastckpt.ConfigError, match="unknown fastckpt setting"):
        instantiate({"root": str(tmp_path), "concurency": 2})
    with pytest.raises(fastckpt.ConfigError, match="strategy group"):
        instantiate({"root": str(tmp_path), "strategy": {"name": "c", "speed": 1}})


def test_same_fields_everywhere(tmp_path):
    import dataclasses
    fields = {f.name for f in dataclasses.fields(CheckpointerConfig)}
    assert set(flatten(make([]))) <= fields  # the YAML spells only settings that exist
    every = {name: getattr(CheckpointerConfig(), name) for name in fields - {"root"}}
    ck = fastckpt.Checkpointer(str(tmp_path), **every)  # the constructor takes each of them by its name
    assert ck.config == dataclasses.replace(CheckpointerConfig(), root=str(tmp_path))
    ck.close()
    with pytest.raises(fastckpt.ConfigError, match="unknown fastckpt setting.*valid:"):
        fastckpt.Checkpointer(str(tmp_path), concurency=2)


@pytest.mark.parametrize("group,expect", [("off", None), ("aware_w", ("aware", "w", None)),
                                          ("aware_r", ("aware", "r", None)), ("aware_wr", ("aware", "wr", None)),
                                          ("specific", ("tool", "w", "posix"))])
def test_offload_group_builds_the_activation_offload(tmp_path, group, expect):
    from fastckpt.config.hydra import offload_of
    cfg = make([f"root={tmp_path}", f"offload={group}", f"+offload.directory={tmp_path}"] if group != "off"
               else [f"root={tmp_path}", "offload=off"])
    instantiate(cfg).close()  # the offload group is no Checkpointer setting
    off = offload_of(cfg)
    if expect is None:
        assert off is None
    else:
        assert (off.io.mode, off.io.aware, off.io.tool) == expect and off.base == str(tmp_path)


def test_offload_overrides_and_errors(tmp_path):
    from fastckpt.config.hydra import offload_of
    from lightning_fastckpt import TensorOffload
    cfg = make([f"root={tmp_path}", "offload=specific", "offload.tool=direct", "offload.threshold_mb=0.5"])
    off = offload_of(cfg)
    assert off.io.tool == "direct" and off.threshold == 1 << 19
    cb = TensorOffload.from_config(cfg.offload)
    assert cb.io.tool == "direct" and cb.offload.threshold == 1 << 19
    assert TensorOffload.from_config(make(["offload=off"]).offload) is None
    with pytest.raises(fastckpt.ConfigError, match=r"unknown offload setting\(s\) \['treshold_mb'\]"):
        offload_of(make([f"root={tmp_path}", "offload=aware_wr", "+offload.treshold_mb=1"]))
    with pytest.raises(fastckpt.ConfigError, match="mode='tool' needs tool="):
        offload_of(make([f"root={tmp_path}", "offload=specific", "offload.tool=null"]))
    with pytest.raises(fastckpt.ConfigError, match="unknown offload setting"):
        TensorOffload(str(tmp_path), threshold=1)


def test_tune_group(tmp_path):
    from fastckpt.config.hydra import tuner_of
    assert tuner_of(make([f"root={tmp_path}"])) is None
    auto = tuner_of(make([f"root={tmp_path}", "tune=auto", "tune.overhead=0.1", "tune.ns=[1,2]"]))
    assert auto.overhead == 0.1 and auto.ns == (1, 2) and auto.plan is None
    instantiate(make([f"root={tmp_path}", "tune=auto"])).close()  # not a Checkpointer setting
    with pytest.raises(fastckpt.ConfigError, match="unknown tune setting"):
        tuner_of(make([f"root={tmp_path}", "tune=auto", "+tune.overheads=1"]))


def test_defaults_live_in_one_place():
    """CheckpointerConfig holds every default: the Checkpointer, FastCheckpointIO and the Hydra
    YAML (strategy and store groups, top level) say the same values."""
    import dataclasses
    import inspect

    from lightning_fastckpt import FastCheckpointIO
    defaults = {f.name: f.default for f in dataclasses.fields(CheckpointerConfig)}
    for ctor in (fastckpt.Checkpointer.__init__, FastCheckpointIO.__init__):
        for name, p in inspect.signature(ctor).parameters.items():
            if name in defaults and name != "root":
                assert p.default == defaults[name], (ctor.__qualname__, name)
    for group in ("c", "g", "d"):
        flat = flatten(make([f"strategy={group}"]))
        assert {k: flat[k] for k in ("concurrency", "writers", "chunk_mb")} == \
               {k: defaults[k] for k in ("concurrency", "writers", "chunk_mb")}, group
    for store in ("root", "pmem"):
        flat = flatten(make([f"store={store}"]))
        for k, v in flat.items():
            if k not in ("root", "strategy", "store"):
                assert v == defaults[k], (store, k, v)


@pytest.mark.parametrize("override,says", [
    ("concurrency=-1", "concurrency must be an integer >= 1, got -1"),
    ("format=safetenors", "unknown format 'safetenors'; choose one of: torch, safetensors"),
    ("policy=skipp", "unknown policy 'skipp'"),
    ("store.persist=fencee", "unknown setting 'persist' of store=root"),
    ("+concurency=4", "unknown fastckpt setting(s) ['concurency']; valid:"),
    ("concurency=4", "unknown setting 'concurency' in 'concurency=4'; valid: chunk_mb, commit_timeout_s, concurrency"),
])
def test_the_demo_refuses_a_bad_config_at_once_in_one_line(tmp_path, override, says):
    """Before any work (the torch.save reference takes a minute): exit 2 and one line that says
    what is wrong — no traceback, not Hydra's 'use +key'."""
    import sys
    import time
    t0 = time.monotonic()
    r = warm.run([sys.executable, "-m", "fastckpt.demo", override, f"hydra.run.dir={tmp_path}"],
                 capture_output=True, text=True, timeout=120,
                 cwd=ROOT)
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip() and "real_accelerator" not in x]
    assert len(lines) == 1 and says in lines[0], r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert time.monotonic() - t0 < 60
    assert not os.path.exists(tmp_path / "torch_save")


def test_every_entry_checks_values_before_building_anything(tmp_path):
    from deepspeed_fastckpt.settings import checkpointer_config
    from lightning_fastckpt import FastCheckpointIO
    with pytest.raises(fastckpt.ConfigError, match="concurrency must be"):
        FastCheckpointIO(concurrency=0)
    with pytest.raises(fastckpt.ConfigError, match="unknown persist"):
        FastCheckpointIO.from_config({"persist": "fencee"})
    with pytest.raises(fastckpt.ConfigError, match="writers must be"):
        checkpointer_config({"writers": 0})
    with pytest.raises(fastckpt.ConfigError, match="stall_timeout_s must be"):
        fastckpt.Checkpointer(str(tmp_path / "ck"), stall_timeout_s=-1)
    assert not os.path.exists(tmp_path / "ck")


def test_the_earlier_name_of_the_root_store_is_refused_with_its_new_name(tmp_path):
    """store="file" was the root store's name in 0.1; 0.2 dropped the alias (CHANGELOG.md): a
    config that still says so is a one-line error naming "root", and nothing is created."""
    with pytest.raises(fastckpt.ConfigError, match=r"unknown store 'file'.*store='root'"):
        fastckpt.Checkpointer(tmp_path / "a", store="file")
    with pytest.raises(MissingConfigException, match="Could not find 'store/file'"):  # Hydra's own words
        make([f"root={tmp_path / 'b'}", "store=file"])
    with pytest.raises(fastckpt.ConfigError, match=r"unknown store 'file'.*store='root'"):
        instantiate({"root": str(tmp_path / "b"), "store": "file"})
    assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")
