"""`fastckpt ls`, `verify` and `export` of PyTorch DCP checkpoints, each a process of its own (the
installed command is that CLI, checked once; the checks run `python -m fastckpt.tools.cli`): a folder holding a committed checkpoint of ours, one DCP's own writer wrote, one whose commit
never happened and one cut short before its `.metadata` is listed with each status; verify reads
every byte and names a damaged item by its key in the state (ours and DCP's own files), or
damage between items by the commit record; export writes the whole state of a checkpoint saved
as DTensor shards on 2 gloo ranks into one safetensors or torch file."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.distributed.checkpoint as dcp

import fastckpt
from fastckpt.commit import record
from fastckpt.dcp import FastStorageWriter
from fastckpt.commit.record import COMMIT_NAME as RECORD
from support import warm
from support.paths import ROOT, WORKERS, python_path

sys.path.insert(0, WORKERS)
from dcp_worker import full_state  # noqa: E402 - the 2-rank save's state
from test_dcp_storage import run_ranks  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
FASTCKPT = os.path.join(os.path.dirname(sys.executable), "fastckpt")


def cli(*args) -> tuple[int, str]:
    p = warm.run([sys.executable, "-m", "fastckpt.tools.cli", *map(str, args)], capture_output=True, text=True,
                 timeout=300, env=dict(os.environ, PYTHONPATH=python_path(ROOT)))
    return p.returncode, p.stdout + p.stderr


def test_the_installed_command_is_this_cli():
    p = subprocess.run([FASTCKPT, "--help"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "verify" in p.stdout and "export" in p.stdout, p.stdout + p.stderr


def state(i: int) -> dict:
    g = torch.Generator().manual_seed(i)
    return {"model": {"w": torch.randn(256, 64, generator=g), "b": torch.randn(64, generator=g)},
            "step": i, "note": f"run {i}"}


def ours(path, i: int) -> None:
    writer = FastStorageWriter(path, step=i, chunk_mb=1)
    dcp.save(state(i), storage_writer=writer)
    writer.close()


def flip(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x10]))


def item_offset(directory, fqn: str) -> tuple[int, int]:
    from fastckpt.dcp.check import read_metadata
    md = read_metadata(str(directory))
    info = next(v for k, v in md.storage_data.items() if k.fqn == fqn)
    return info.offset, info.length


@pytest.fixture
def folder(tmp_path):
    run = tmp_path / "run"
    ours(run / "step-1", 1)
    ours(run / "step-2", 2)
    dcp.save(state(3), storage_writer=dcp.FileSystemWriter(run / "step-3"))
    ours(run / "step-4", 4)
    os.remove(run / "step-4" / RECORD)  # killed after .metadata, before the record
    ours(run / "step-5", 5)
    for name in os.listdir(run / "step-5"):
        if not name.endswith(".distcp"):
            os.remove(run / "step-5" / name)  # killed before .metadata
    return run


def test_ls_lists_each_dcp_checkpoint_with_its_status(folder):
    code, out = cli("ls", folder)
    assert code == 0, out
    assert "a folder of PyTorch DCP checkpoints" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip().startswith("step-")}
    assert "committed (DCP, 1 rank, by fastckpt)" in rows["step-1"] and "committed" in rows["step-2"]
    assert "foreign (DCP, by its own writer" in rows["step-3"]
    assert "incomplete (fastckpt began it and never committed it" in rows["step-4"]
    assert "incomplete (no .metadata: a save cut short)" in rows["step-5"]
    code, out = cli("ls", folder / "step-2")
    assert code == 0 and "one PyTorch DCP checkpoint" in out and "committed" in out, out


def test_verify_reads_every_byte_and_names_a_damaged_item(folder):
    code, out = cli("verify", folder)
    assert code == 0 and "OK: every byte checks" in out, out
    assert "skip" in out and "step-4" in out  # an incomplete one is never loaded: skipped
    off, length = item_offset(folder / "step-2", "model.w")
    flip(folder / "step-2" / "__0_0.distcp", off + length - 2000)  # inside the tensor's data
    code, out = cli("verify", folder)
    assert code == 1 and "CORRUPT" in out and "item 'model.w' is damaged" in out and "CRC-32" in out, out
    off, length = item_offset(folder / "step-3", "model.b")  # DCP's own file: the archive's own CRCs
    flip(folder / "step-3" / "__0_0.distcp", off + length - 300)
    code, out = cli("verify", folder / "step-3")
    assert code == 1 and "item 'model.b' is damaged" in out, out
    off, length = item_offset(folder / "step-1", "note")  # a byte item: a torch.save archive as well
    flip(folder / "step-1" / "__0_0.distcp", off + length - 1)
    code, out = cli("verify", folder / "step-1")
    assert code == 1 and "item 'note' is damaged" in out, out
    off, length = item_offset(folder / "step-2", "model.b")  # the zeros before an aligned archive:
    gap = off - 1  # no item holds them, the record's whole-file CRC does
    ours(folder / "step-6", 6)
    flip(folder / "step-6" / "__0_0.distcp", gap)
    code, out = cli("verify", folder / "step-6")
    assert code == 1 and "step-6/__0_0.distcp: file CRC-32 differs from its commit record" in out, out
    code, out = cli("verify", folder / "step-4")
    assert code == 1 and "incomplete" in out and "cannot be loaded" in out, out


def test_export_writes_the_whole_state_of_a_checkpoint_saved_in_shards_on_two_ranks(tmp_path):
    run_ranks("save", tmp_path / "run" / "step-7", 2)
    assert record.read(str(tmp_path / "run" / "step-7"), RECORD, every_rank=False).world_size == 2
    want = full_state()
    for fmt, out in (("safetensors", tmp_path / "full.safetensors"), ("torch", tmp_path / "full.pt")):
        code, said = cli("export", tmp_path / "run", out, "--to", fmt)
        assert code == 0 and "step-7, all ranks' shards" in said, said
        got = fastckpt.load(str(out))
        for key in want["model"]:
            assert torch.equal(got["model"][key], want["model"][key]), key
        assert torch.equal(got["optim"]["exp_avg"], want["optim"]["exp_avg"]) and got["optim"]["step"] == 7
        assert got["extra"] == want["extra"]
    code, said = cli("export", tmp_path / "run", tmp_path / "x.pt", "--to", "torch", "--step", 3)
    assert code == 1 and "no committed DCP checkpoint of step 3" in said, said
    shutil.rmtree(tmp_path / "run")
