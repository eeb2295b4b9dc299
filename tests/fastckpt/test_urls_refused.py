"""An object store's URL where fastckpt writes to local paths (issue 66's first point): every front
end refuses it in one line, before any work, and no local folder named after the scheme (`s3:`) is
made. Before, `Checkpointer("s3://ckpt/run")` wrote a local folder `s3:` and loaded from it while the
bucket stayed empty, `FastStorageWriter("memory://…")` did the same, and `newest_committed("s3://…")`
said there was nothing to resume from. (Lightning's own paths may be fsspec URLs: that store uploads.)"""
from __future__ import annotations

import os

import pytest
import torch

from fastckpt.errors import ConfigError

URL = "s3://ckpt/run7"


def front_ends():
    import fastckpt
    from fastckpt.dcp import FastStorageReader, FastStorageWriter, committed, newest_committed
    from lightning_fastckpt import FastCheckpointIO
    return {
        "Checkpointer(root)": lambda: fastckpt.Checkpointer(URL),
        "Checkpointer(tiers)": lambda: fastckpt.Checkpointer(tiers=["shm-run7", URL]),
        "Checkpointer(memory tier)": lambda: fastckpt.Checkpointer(tiers=[URL, "disk-run7"]),
        "Hydra root=": lambda: _hydra(f"root={URL}"),
        "FastCheckpointIO(tiers)": lambda: FastCheckpointIO(tiers=[URL]),
        "DeepSpeed entry": lambda: _deepspeed({"tiers": [URL]}),
        "FastStorageWriter": lambda: FastStorageWriter(URL + "/step-1"),
        "FastStorageReader": lambda: FastStorageReader(URL + "/step-1"),
        "newest_committed": lambda: newest_committed(URL),
        "committed": lambda: committed(URL),
        "dcp.save(checkpoint_id=URL)": lambda: _dcp_save(FastStorageWriter("local/step-1")),
    }


def _hydra(override: str):
    from hydra import compose, initialize_config_dir

    from fastckpt.config.hydra import instantiate
    from support.paths import CONFIGS
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        return instantiate(compose(config_name="config", overrides=[override]))


def _deepspeed(entry: dict):
    from deepspeed_fastckpt.settings import checkpointer_config
    return checkpointer_config(entry)


def _dcp_save(writer):
    import torch.distributed.checkpoint as dcp
    dcp.save({"w": torch.ones(2)}, checkpoint_id=URL + "/step-1", storage_writer=writer)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("front_end", sorted(front_ends()))
def test_a_url_is_refused_in_one_line_and_no_local_folder_is_made(front_end, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as refused:
        front_ends()[front_end]()
    said = str(refused.value)
    assert "\n" not in said and URL in said and "s3://" in said, said
    assert not any(name.endswith(":") for name in os.listdir(tmp_path)), os.listdir(tmp_path)
