"""Hydra groups and overrides build the Checkpointer; bad values give clear errors."""
from __future__ import annotations

import os

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import MissingConfigException

import fastckpt
from fastckpt.config import CheckpointerConfig, flatten, instantiate

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs")


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


def test_unknown_group_value_is_hydras_error():
    with pytest.raises(MissingConfigException, match="strategy"):
        make(["strategy=zz"])


def test_unknown_keys_are_clear_errors(tmp_path):
    with pytest.raises(fastckpt.ConfigError, match="unknown fastckpt setting"):
        instantiate({"root": str(tmp_path), "concurency": 2})
    with pytest.raises(fastckpt.ConfigError, match="strategy group"):
        instantiate({"root": str(tmp_path), "strategy": {"name": "c", "speed": 1}})


def test_same_fields_everywhere():
    import dataclasses
    import inspect
    ctor = set(inspect.signature(fastckpt.Checkpointer.__init__).parameters) - {"self"}
    assert ctor == {f.name for f in dataclasses.fields(CheckpointerConfig)}
    flat = flatten(make([]))
    assert set(flat) <= ctor


@pytest.mark.parametrize("group,expect", [("off", None), ("aware_w", ("aware", "w", None)),
                                          ("aware_r", ("aware", "r", None)), ("aware_wr", ("aware", "wr", None)),
                                          ("specific", ("tool", "wr", "posix"))])
def test_offload_group_builds_the_activation_offload(tmp_path, group, expect):
    from fastckpt.config import offload_of
    cfg = make([f"root={tmp_path}", f"offload={group}", f"+offload.directory={tmp_path}"] if group != "off"
               else [f"root={tmp_path}", "offload=off"])
    instantiate(cfg).close()  # the offload group is no Checkpointer setting
    off = offload_of(cfg)
    if expect is None:
        assert off is None
    else:
        assert (off.io.mode, off.io.aware, off.io.tool) == expect and off.base == str(tmp_path)


def test_offload_overrides_and_errors(tmp_path):
    from fastckpt.config import offload_of
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
    from fastckpt.config import tuner_of
    assert tuner_of(make([f"root={tmp_path}"])) is None
    auto = tuner_of(make([f"root={tmp_path}", "tune=auto", "tune.overhead=0.1", "tune.ns=[1,2]"]))
    assert auto.overhead == 0.1 and auto.ns == (1, 2) and auto.plan is None
    instantiate(make([f"root={tmp_path}", "tune=auto"])).close()  # not a Checkpointer setting
    with pytest.raises(fastckpt.ConfigError, match="unknown tune setting"):
        tuner_of(make([f"root={tmp_path}", "tune=auto", "+tune.overheads=1"]))
