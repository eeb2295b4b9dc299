"""`fastckpt ls` and `verify` on every folder a plugin writes: Lightning's ModelCheckpoint folder,
a DeepSpeed save folder and one of its tags, a pool given as its folder; "nothing here" and "no
such path" are not corruption (exit 2, never 1); a DAX path that is no DAX device is refused."""
from __future__ import annotations

import os
import re
import warnings

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fastckpt import Checkpointer
from fastckpt.tools.cli import main
from fastckpt.errors import ConfigError
from lightning_fastckpt import FastCheckpointIO
from support.states import flip_byte
from workers.lit_app import TinyModule, loader, trainer


@pytest.fixture(scope="module")
def lightning_folder(tmp_path_factory):
    """What ModelCheckpoint writes through FastCheckpointIO: epoch=…-step=….ckpt files and last.ckpt."""
    folder = tmp_path_factory.mktemp("lightning") / "checkpoints"
    cb = ModelCheckpoint(dirpath=str(folder), every_n_train_steps=2, save_top_k=-1, save_last=True)
    trainer(FastCheckpointIO(), [cb], max_steps=6).fit(TinyModule(), loader())
    return folder


def test_a_lightning_checkpoint_folder_lists_and_verifies(lightning_folder, capsys):
    assert main(["ls", str(lightning_folder)]) == 0
    out = capsys.readouterr().out
    assert "a folder of checkpoint files" in out and "last.ckpt" in out
    for step in (2, 4, 6):
        line = next(x for x in out.splitlines() if f"step={step}.ckpt" in x)
        assert f" {step} " in line and "complete" in line and "by fastckpt" in line, line
    assert main(["verify", str(lightning_folder)]) == 0
    out = capsys.readouterr().out
    assert "CORRUPT" not in out and out.count("ok ") == 4 and "OK: every byte checks" in out


def test_a_save_in_flight_is_no_checkpoint_and_is_listed_apart_under_its_own_name(lightning_folder, tmp_path,
                                                                                  capsys):
    folder = tmp_path / "copy"
    folder.mkdir()
    for name in os.listdir(lightning_folder):
        (folder / name).write_bytes((lightning_folder / name).read_bytes())
    tmp = ".epoch=0-step=8.ckpt.fastckpt-4242-9.tmp"
    (folder / tmp).write_bytes(b"PK\x03\x04 half a file")
    assert main(["ls", str(folder)]) == 0
    table, apart = capsys.readouterr().out.split("not checkpoints:", 1)
    assert "step=8.ckpt" not in table and tmp in apart
    assert main(["verify", str(folder)]) == 0
    assert f"skip    {folder / tmp}: not a checkpoint" in capsys.readouterr().out


def test_a_damaged_lightning_checkpoint_is_named(lightning_folder, tmp_path, capsys):
    bad = tmp_path / "last.ckpt"
    bad.write_bytes((lightning_folder / "last.ckpt").read_bytes())
    flip_byte(str(bad))
    assert main(["verify", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "CORRUPT" in out and "last.ckpt" in out and "CORRUPTION FOUND" in out


@pytest.fixture(scope="module")
def deepspeed_folder(tmp_path_factory):
    pytest.importorskip("deepspeed")
    from support.deepspeed_runs import run
    base = tmp_path_factory.mktemp("deepspeed")
    run("train", base / "ck", base / "out.pt", "--stage", "1", ranks=1)
    return base / "ck"


def test_a_deepspeed_save_folder_and_its_tag_list_and_verify(deepspeed_folder, capsys):
    assert main(["ls", str(deepspeed_folder)]) == 0
    out = capsys.readouterr().out
    assert "a DeepSpeed save folder" in out
    line = next(x for x in out.splitlines() if "global_step3" in x)
    assert line.startswith("*") and "committed" in line, out  # the tag `latest` names
    assert main(["verify", str(deepspeed_folder)]) == 0
    out = capsys.readouterr().out
    assert "OK: every byte checks" in out and "UNSAFE" not in out  # DeepSpeed's types, as its engine allows them
    assert main(["ls", str(deepspeed_folder / "global_step3")]) == 0
    assert "one DeepSpeed tag" in capsys.readouterr().out
    assert main(["verify", str(deepspeed_folder / "global_step3")]) == 0


def test_a_damaged_deepspeed_tag_fails_verify(deepspeed_folder, tmp_path, capsys):
    tag = tmp_path / "global_step3"
    tag.mkdir()
    for name in os.listdir(deepspeed_folder / "global_step3"):
        (tag / name).write_bytes((deepspeed_folder / "global_step3" / name).read_bytes())
    model_states = next(n for n in os.listdir(tag) if n.endswith("model_states.pt"))
    flip_byte(str(tag / model_states))
    assert main(["verify", str(tag)]) == 1
    assert model_states in capsys.readouterr().out


def test_nothing_here_and_no_such_path_are_not_corruption(tmp_path, capsys):
    (tmp_path / "run" / "logs" / "ck").mkdir(parents=True)
    ck = Checkpointer(str(tmp_path / "run" / "logs" / "ck"))
    ck.save({"w": torch.ones(4)}, step=1)
    ck.close()
    assert main(["verify", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "no checkpoints in" in err and str(tmp_path / "run" / "logs" / "ck") in err and "CORRUPT" not in err
    assert main(["ls", str(tmp_path / "typo")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["verify", str(tmp_path / "typo")]) == 2


def test_a_pool_given_as_its_folder(tmp_path, capsys):
    ck = Checkpointer(str(tmp_path), store="pmem", pool_mb=64)  # the pool: tmp_path/fastckpt.pool
    ck.save({"w": torch.arange(10.0)}, step=5)
    ck.close()
    assert main(["info", str(tmp_path)]) == 0
    assert "pool persist" in capsys.readouterr().out
    assert main(["ls", str(tmp_path)]) == 0
    assert "step          5" in capsys.readouterr().out
    assert main(["verify", str(tmp_path)]) == 0
    (tmp_path / "other").mkdir()
    assert main(["info", str(tmp_path / "other")]) == 1
    assert "is not a pool" in capsys.readouterr().err


@pytest.mark.skipif(os.path.exists("/dev/dax0.0"), reason="this machine has that DAX device")
def test_a_dax_path_that_is_no_dax_device_is_refused():
    with pytest.raises(ConfigError, match="not a DAX device"):
        Checkpointer("/dev/dax0.0", store="pmem")
    assert not os.path.exists("/dev/dax0.0")


def test_committed_and_verified_mean_what_they_say_everywhere(tmp_path, capsys):
    """The issue's case: step 240 has a flipped byte, step 230 is truncated. `ls` and latest()
    say committed (records and sizes: 240 yes, 230 no), latest(verified=True) and load() agree
    on 220, and export names the step it wrote and why the newer ones were passed over."""
    root = str(tmp_path / "ck")
    with Checkpointer(root, keep=5) as ck:
        for step in (220, 230, 240):
            ck.save({"w": torch.randn(50_000), "step": step}, step=step)
    files = {s: next(str(p) for p in (tmp_path / "ck").glob(f"step-{s:08d}.*/rank-0.pt")) for s in (230, 240)}
    flip_byte(files[240])
    os.truncate(files[230], os.path.getsize(files[230]) - 100)

    assert main(["ls", root]) == 0
    rows = {int(re.search(r"step-(\d{8})", x).group(1)): x for x in capsys.readouterr().out.splitlines()
            if "step-0" in x}
    assert "committed" in rows[240] and "invalid" in rows[230] and "truncated" in rows[230] and "committed" in rows[220]
    ck = Checkpointer(root)
    assert ck.latest().step == 240 and ck.latest(verified=True).step == 220
    with pytest.warns(UserWarning, match="loaded step 220; passed over: ") as got:
        assert ck.load()["step"] == 220
    said = str(got[0].message)
    assert "step 240" in said and "CRC-32" in said and "step-00000230" in said and "truncated" in said
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # export says it in its one line, not in a raw warning
        assert main(["export", root, str(tmp_path / "out.pt"), "--to", "torch"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"wrote {tmp_path / 'out.pt'}") and ": step 220; passed over:" in out and "240" in out
    assert len(out.splitlines()) == 1
    assert main(["verify", root]) == 1


def test_one_checkpoint_asked_about_that_never_committed_fails_verify(tmp_path, capsys):
    root = tmp_path / "ck"
    with Checkpointer(str(root)) as ck:
        ck.save({"w": torch.ones(8)}, step=1)
    (step_dir,) = root.glob("step-*")
    (step_dir / "COMMIT").unlink()
    assert main(["verify", str(step_dir)]) == 1
    assert "never committed" in capsys.readouterr().out
    assert main(["verify", str(root)]) == 0  # in a root it is skipped, as load skips it
    assert "skip " in capsys.readouterr().out


def test_the_command_line_says_what_it_means(tmp_path, capsys):
    """Issue 19 item 6: each message names the thing and what to do about it."""
    import collections

    from fastckpt.tools import goodput
    root = str(tmp_path / "ck")
    with Checkpointer(root) as ck:
        ck.save({"w": torch.ones(4)}, step=20)
    assert main(["export", str(tmp_path / "typo"), str(tmp_path / "o.pt"), "--to", "torch"]) == 1
    assert "typo does not exist" in capsys.readouterr().err
    assert main(["export", root, str(tmp_path / "o.pt"), "--to", "torch", "--step", "10"]) == 1
    assert "steps committed there: 20" in capsys.readouterr().err
    assert main(["tune", str(tmp_path), "--step-s", "0.1", "--like", root]) == 1
    assert "--like takes one checkpoint file" in capsys.readouterr().err
    pickled = str(tmp_path / "pickled.pt")
    torch.save({"w": torch.ones(2), "counts": collections.Counter("aab")}, pickled)
    assert main(["export", pickled, str(tmp_path / "o.pt"), "--to", "torch"]) == 1
    err = capsys.readouterr().err
    assert "--trust-pickle" in err and "weights_only=False" not in err
    assert main(["export", pickled, str(tmp_path / "o.pt"), "--to", "torch", "--trust-pickle"]) == 0
    capsys.readouterr()
    (tmp_path / "trace.csv").write_text("time,node\n10,3\n")
    with pytest.raises(ConfigError, match="row 1: 'time' is not a time in seconds"):
        goodput.read_trace(str(tmp_path / "trace.csv"))
    with pytest.raises(SystemExit) as code:
        main(["--version"])
    assert code.value.code == 0 and capsys.readouterr().out.startswith("fastckpt ")
    info = Checkpointer(root).latest()
    assert len(repr(info)) < 200 and "step=20" in repr(info)
    assert "strategy='c'" in repr(Checkpointer(root))
    assert repr(FastCheckpointIO(concurrency=3)) == "FastCheckpointIO(concurrency=3)"
