"""A URL where fastckpt has no store for it (issue 66's first point): every front end refuses it
in one line, before any work, and no local folder named after the scheme (`gs:`) is made. Before,
`Checkpointer("s3://ckpt/run")` wrote a local folder `s3:` and loaded from it while the bucket
stayed empty. s3:// is a store now (the root of a Checkpointer, its last tier, a DCP checkpoint:
tests/fastckpt/s3/); an unknown scheme is still an error, never a local path, and so is s3:// where no
S3 store is built (a tier before the last; a memory tier in front of named paths; DeepSpeed's
save_dir: tests/deepspeed_fastckpt/). Without AWS credentials an s3:// place is a one-line error
saying where they go.
(Lightning's own paths may be fsspec URLs: that store uploads.)"""
from __future__ import annotations

import os

import pytest
import torch

from fastckpt.errors import ConfigError

URL = "gs://ckpt/run7"
S3 = "s3://ckpt/run7"


def front_ends(url: str):
    import fastckpt
    from fastckpt.dcp import FastStorageReader, FastStorageWriter, committed, newest_committed
    from lightning_fastckpt import FastCheckpointIO
    return {
        "Checkpointer(root)": lambda: fastckpt.Checkpointer(url),
        "Checkpointer(tiers)": lambda: fastckpt.Checkpointer(tiers=["shm-run7", url]),
        "Checkpointer(memory tier)": lambda: fastckpt.Checkpointer(tiers=[url, "disk-run7"]),
        "Hydra root=": lambda: _hydra(f"root={url}"),
        "FastCheckpointIO(tiers)": lambda: FastCheckpointIO(tiers=[url]),
        "DeepSpeed entry": lambda: _deepspeed({"tiers": [url]}),
        "FastStorageWriter": lambda: FastStorageWriter(url + "/step-1"),
        "FastStorageReader": lambda: FastStorageReader(url + "/step-1"),
        "newest_committed": lambda: newest_committed(url),
        "committed": lambda: committed(url),
        "dcp.save(checkpoint_id=URL)": lambda: _dcp_save(FastStorageWriter("local/step-1"), url),
    }


S3_NOT_YET = ("Checkpointer(memory tier)", "FastCheckpointIO(tiers)", "DeepSpeed entry")


def _hydra(override: str):
    from hydra import compose, initialize_config_dir

    from fastckpt.config.hydra import instantiate
    from support.paths import CONFIGS
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        return instantiate(compose(config_name="config", overrides=[override]))


def _deepspeed(entry: dict):
    from deepspeed_fastckpt.settings import checkpointer_config
    return checkpointer_config(entry)


def _dcp_save(writer, url: str):
    import torch.distributed.checkpoint as dcp
    dcp.save({"w": torch.ones(2)}, checkpoint_id=url + "/step-1", storage_writer=writer)


def refused_in_one_line(call, url: str, tmp_path) -> str:
    with pytest.raises(ConfigError) as refused:
        call()
    said = str(refused.value)
    assert "\n" not in said and url in said, said
    assert not any(name.endswith(":") for name in os.listdir(tmp_path)), os.listdir(tmp_path)
    return said


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("front_end", sorted(front_ends(URL)))
def test_a_url_of_no_store_is_refused_in_one_line_and_no_local_folder_is_made(front_end, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    said = refused_in_one_line(front_ends(URL)[front_end], URL, tmp_path)
    assert "gs://" in said, said


@pytest.mark.parametrize("front_end", S3_NOT_YET)
def test_s3_where_no_s3_store_is_built_yet_is_refused_in_one_line(front_end, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    refused_in_one_line(front_ends(S3)[front_end], S3, tmp_path)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("front_end", sorted(set(front_ends(S3)) - set(S3_NOT_YET)))
def test_an_s3_place_without_credentials_is_one_line_saying_where_they_go(front_end, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.setenv(name, os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    from fastckpt.store.s3 import client
    monkeypatch.setattr(client, "_BUCKETS", {})
    said = refused_in_one_line(front_ends(S3)[front_end], S3, tmp_path)
    assert "AWS_ACCESS_KEY_ID" in said and "credentials" in said, said
