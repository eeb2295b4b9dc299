"""FastCheckpointIO under a real Lightning Trainer (single process, CPU).

Each test runs the same deterministic training with Lightning's own
TorchCheckpointIO where a reference is needed: the files ModelCheckpoint leaves
and every value in them must match, which also proves that no snapshot saw a
half-updated step (the model's wide layer takes longer to copy than a step).
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from io import BytesIO

import fsspec
import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

import fastckpt
from lightning_fastckpt import FastCheckpointIO
from support import warm
from support.paths import CONFIGS as CONFIG_DIR
from workers.lit_app import TinyModule, assert_equal, loader, trainer

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


def fit(io, dirpath, steps=24, big=0, **mc):
    torch.manual_seed(0)
    cb = ModelCheckpoint(dirpath=str(dirpath), **mc)
    t = trainer(io, [cb], max_steps=steps)
    model = TinyModule(big=big)
    t.fit(model, loader(), loader())
    return t, cb, model


def files(d) -> list[str]:
    return sorted(os.listdir(d))


def load(p):
    return torch.load(p, weights_only=True)


CONFIGS = [
    dict(every_n_train_steps=3, save_last=True, save_top_k=2, monitor="loss"),
    dict(every_n_epochs=1, save_last="link", save_top_k=-1),
    dict(every_n_train_steps=5, save_top_k=1, monitor="loss", mode="max"),
]


@pytest.mark.parametrize("mc", CONFIGS, ids=["steps-last-topk", "epochs-link", "top1-max"])
def test_same_files_and_values_as_torch_io(tmp_path, mc):
    _, ref_cb, _ = fit(TorchCheckpointIO(), tmp_path / "ref", big=0, **mc)
    t, cb, _ = fit(FastCheckpointIO(concurrency=2), tmp_path / "fast", big=0, **mc)
    assert files(tmp_path / "fast") == files(tmp_path / "ref")
    assert os.path.basename(cb.best_model_path) == os.path.basename(ref_cb.best_model_path)
    for name in files(tmp_path / "ref"):
        ref, got = load(tmp_path / "ref" / name), load(tmp_path / "fast" / name)
        ref["callbacks"] = got["callbacks"] = None  # these hold the (different) dirpaths
        assert_equal(got, ref, name)
    if mc.get("save_last") == "link":
        assert os.path.islink(tmp_path / "fast" / "last.ckpt")


@pytest.mark.parametrize("layerwise", [False, True], ids=["async", "layerwise"])
def test_each_snapshot_is_one_step_exactly(tmp_path, layerwise):
    """One 4 MiB staging chunk: the wide layer's 108 MB (weights + Adam state) can only be
    copied as fast as the disk drains it, far slower than a step, so an update not gated
    on the copy would leave values of two steps in the file."""
    from lightning_fastckpt import LayerwiseCheckpointing
    mc = dict(every_n_train_steps=4, save_top_k=-1)
    _, _, _ = fit(TorchCheckpointIO(), tmp_path / "ref", steps=12, big=3072, **mc)
    fast = str(tmp_path / "fast")
    torch.manual_seed(0)
    cbs = [ModelCheckpoint(dirpath=fast, **mc)] + ([LayerwiseCheckpointing()] if layerwise else [])
    trainer(FastCheckpointIO(chunk_mb=4, staging_mb=4), cbs, max_steps=12).fit(TinyModule(big=3072), loader(), loader())
    assert files(fast) == files(tmp_path / "ref")
    for name in files(fast):
        ref, got = load(tmp_path / "ref" / name), load(os.path.join(fast, name))
        ref["callbacks"] = got["callbacks"] = None
        assert_equal(got, ref, name)


def test_checkpoint_dict_round_trips_every_part(tmp_path):
    t, cb, model = fit(FastCheckpointIO(), tmp_path, every_n_train_steps=4, save_last=True)
    ck = load(tmp_path / "last.ckpt")
    assert set(ck) >= {"epoch", "global_step", "state_dict", "loops", "callbacks", "optimizer_states",
                       "lr_schedulers", "hyper_parameters", "pytorch-lightning_version"}
    opt = ck["optimizer_states"][0]
    assert all(isinstance(k, int) for k in opt["state"])
    assert opt["param_groups"][0]["params"] == list(range(len(opt["param_groups"][0]["params"])))
    assert ck["hyper_parameters"] == {"width": 64, "big": 0, "lr": 1e-2}
    assert_equal(FastCheckpointIO().load_checkpoint(tmp_path / "last.ckpt"), ck)
    # fastckpt's own tools read it too
    out = warm.run([sys.executable, "-m", "fastckpt.tools.cli", "verify", str(tmp_path / "last.ckpt")],
                   capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_resume_last_path_best_and_load_from_checkpoint(tmp_path):
    t, cb, _ = fit(FastCheckpointIO(), tmp_path, steps=16, every_n_train_steps=4, save_last=True,
                   save_top_k=2, monitor="loss")
    last = load(tmp_path / "last.ckpt")
    # resume with ckpt_path="last": training continues from step 16
    t2 = trainer(FastCheckpointIO(), [ModelCheckpoint(dirpath=str(tmp_path), every_n_train_steps=4,
                                                      save_last=True)], max_steps=24)
    t2.fit(TinyModule(), loader(), loader(), ckpt_path="last")
    assert t2.global_step == 24
    # and from an explicit path
    t3 = trainer(FastCheckpointIO(), max_steps=20)
    t3.fit(TinyModule(), loader(), loader(), ckpt_path=str(tmp_path / "last.ckpt"))
    assert t3.global_step == 20
    # load_from_checkpoint bypasses CheckpointIO and calls torch.load itself
    m = TinyModule.load_from_checkpoint(str(tmp_path / "last.ckpt"))
    assert_equal(dict(m.state_dict()), dict(last["state_dict"]))
    # validate/test with ckpt_path="best"
    t.validate(TinyModule(), loader(), ckpt_path="best")
    res = t.test(TinyModule(), loader(), ckpt_path="best")
    assert res and "test_loss" in res[0]


def test_saves_are_asynchronous_and_teardown_waits(tmp_path, monkeypatch):
    """The step after ModelCheckpoint issued a save runs while that save is still landing, and
    teardown waits for every one. In flight by construction, not by the disk's speed: each
    checkpoint's commit waits (after its bytes are written) until the probe has looked once."""
    from fastckpt.commit.checkpoint_unit import CheckpointCommit
    io = FastCheckpointIO(concurrency=2)
    looked = threading.Event()
    finish = CheckpointCommit.finish

    def finish_once_looked(self):
        looked.wait(timeout=60)
        return finish(self)

    monkeypatch.setattr(CheckpointCommit, "finish", finish_once_looked)
    seen = []

    class Probe(L.Callback):
        def on_train_batch_end(self, trainer, *a):
            # the next step began: the saves ModelCheckpoint issued so far, still being written?
            seen.extend(p.done() for p in io.named.tracked().values())
            if seen:
                looked.set()

    torch.manual_seed(0)
    t = trainer(io, [ModelCheckpoint(dirpath=str(tmp_path), every_n_train_steps=2, save_top_k=-1), Probe()],
                max_steps=8)
    t.fit(TinyModule(big=2048), loader(), loader())
    assert False in seen, "no save was still in flight when the next step began"
    assert len(files(tmp_path)) == 4 and all(load(tmp_path / f)["global_step"] > 0 for f in files(tmp_path))
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".")], "temporary files left behind"
    left = [th for th in threading.enumerate() if th is not threading.main_thread() and not th.daemon]
    assert not left, f"non-daemon threads left after teardown: {left}"


def test_save_outside_fit_is_durable_on_return(tmp_path):
    t, _, model = fit(FastCheckpointIO(), tmp_path / "run", steps=4)
    p = tmp_path / "manual.ckpt"
    t.save_checkpoint(p)
    assert load(p)["global_step"] == 4  # no wait needed: the file is complete and committed
    assert_equal(dict(load(p)["state_dict"]), {k: v for k, v in model.state_dict().items()})


def test_write_error_surfaces_at_next_save_or_teardown(mount_tmpfs):
    root = mount_tmpfs(1 << 20)  # room for a small checkpoint, not for the big model's
    io = FastCheckpointIO()
    t = trainer(io, [ModelCheckpoint(dirpath=root, every_n_train_steps=2, save_top_k=-1)], max_steps=6)
    with pytest.raises(Exception) as e:
        t.fit(TinyModule(big=1024), loader(), loader())
    assert "No space left" in str(e.value) or "ENOSPC" in str(e.value) or "space" in str(e.value)
    assert not [f for f in os.listdir(root) if not f.startswith(".")], "a partial .ckpt became visible"


def test_remove_never_blocks_nor_deletes_the_only_valid_checkpoint(tmp_path):
    io = FastCheckpointIO(layerwise=True)  # held saves stay in flight until released
    io.saves.gate.steps_seen = 1  # as inside fit
    # ... after a step whose watched save saw no write: saves are held, not copied before save()
    # returns (without it, b was copied at once and could land before remove(a): a race)
    io.saves.gate.trust.deferred = True
    a, b, c = (str(tmp_path / f"{n}.ckpt") for n in "abc")
    io.save_checkpoint({"w": torch.arange(10.0), "global_step": 1}, a)
    io.named.pending(a).release_all()
    io.named.pending(a).wait()
    io.save_checkpoint({"w": torch.arange(10.0) + 1, "global_step": 2}, b)  # held: in flight
    io.remove_checkpoint(a)  # b is not committed yet: a is the only valid checkpoint
    assert os.path.exists(a)
    io.remove_checkpoint(b)  # in flight: returns at once, deleted only after it has landed
    assert not io.named.pending(b).done()
    io.save_checkpoint({"w": torch.arange(10.0) + 2, "global_step": 3}, c)
    got = io.load_checkpoint(b)  # loading an in-flight path waits for it
    assert torch.equal(got["w"], torch.arange(10.0) + 1)
    assert os.path.exists(a) and os.path.exists(b)  # c, the newest, is still in flight
    io.teardown()  # c committed: both deferred removals happen now, and b does not come back
    assert not os.path.exists(a) and not os.path.exists(b) and os.path.exists(c)
    assert [f for f in os.listdir(tmp_path)] == ["c.ckpt"]
    io.remove_checkpoint(c)  # nothing in flight after teardown: removed at once, as Lightning's IO does
    assert not os.path.exists(c)


def test_removal_is_immediate_and_a_crashed_removal_is_swept(tmp_path):
    io = FastCheckpointIO()
    a, b = str(tmp_path / "a.ckpt"), str(tmp_path / "b.ckpt")
    io.save_checkpoint({"w": torch.arange(10.0)}, a)  # outside fit: durable on return
    io.save_checkpoint({"w": torch.arange(10.0) + 1}, b)
    io.remove_checkpoint(a)  # b is committed: the name goes now, the blocks are freed later
    assert not os.path.exists(a)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f".old.ckpt.fastckpt-{dead.pid}-rm3.tmp").write_bytes(b"x" * 100)
    (tmp_path / f".per-rank.fastckpt-{dead.pid}-rm4.tmp").mkdir()
    (tmp_path / f".per-rank.fastckpt-{dead.pid}-rm4.tmp" / "rank-0.1-1.pt").write_bytes(b"x")
    live = tmp_path / f".other.ckpt.fastckpt-{os.getppid()}-rm5.tmp"  # its owner still runs
    live.write_bytes(b"y")
    io.save_checkpoint({"w": torch.arange(10.0) + 2}, str(tmp_path / "c.ckpt"))
    io.teardown()
    assert sorted(os.listdir(tmp_path)) == sorted([live.name, "b.ckpt", "c.ckpt"])


def test_memory_url_through_model_checkpoint():
    base = f"memory://ckpts-{os.getpid()}"
    fit(FastCheckpointIO(), base, steps=12, every_n_train_steps=4, save_last=True, save_top_k=1,
        monitor="loss")
    fs, root = fsspec.core.url_to_fs(base)
    names = sorted(os.path.basename(p) for p in fs.ls(root, detail=False))
    ckpts = [n for n in names if n.endswith(".ckpt")]
    assert "last.ckpt" in ckpts and len(ckpts) == 2
    # object-store rule: a commit record next to each file, written last
    assert all(n + ".fastckpt-commit" in names for n in ckpts)
    assert FastCheckpointIO().load_checkpoint(f"{base}/last.ckpt")["global_step"] == 12
    t2 = trainer(FastCheckpointIO(), max_steps=14)
    t2.fit(TinyModule(), loader(), loader(), ckpt_path=f"{base}/last.ckpt")
    assert t2.global_step == 14
    fs.rm(f"{root}/last.ckpt.fastckpt-commit")  # as if fastckpt had not uploaded it: no record
    with pytest.warns(UserWarning, match="no fastckpt commit record"):
        assert FastCheckpointIO().load_checkpoint(f"{base}/last.ckpt")["global_step"] == 12
    buf = BytesIO()  # what Lightning's own IO uploads: torch.save bytes, no record
    torch.save({"global_step": 3, "w": torch.arange(5.0)}, buf)
    fs.pipe_file(f"{root}/plain.ckpt", buf.getvalue())
    with pytest.warns(UserWarning, match="no fastckpt commit record"):
        assert torch.equal(FastCheckpointIO().load_checkpoint(f"{base}/plain.ckpt")["w"], torch.arange(5.0))
    raw = bytearray(fs.cat_file(f"{root}/last.ckpt"))
    raw[len(raw) // 2] ^= 0xFF  # damaged, and no record: its own CRCs still catch it
    fs.pipe_file(f"{root}/last.ckpt", bytes(raw))
    with pytest.raises(fastckpt.CorruptCheckpointError), pytest.warns(UserWarning):
        FastCheckpointIO().load_checkpoint(f"{base}/last.ckpt")


def test_file_url(tmp_path):
    # (ModelCheckpoint itself mangles file:// dirpaths, with any CheckpointIO; explicit saves work)
    t, _, model = fit(FastCheckpointIO(), tmp_path / "run", steps=4)
    url = f"file://{tmp_path}/sub/x.ckpt"
    t.save_checkpoint(url)
    assert load(tmp_path / "sub" / "x.ckpt")["global_step"] == 4
    t2 = trainer(FastCheckpointIO(), max_steps=6)
    t2.fit(TinyModule(), loader(), loader(), ckpt_path=url)
    assert t2.global_step == 6


def test_fabric_save_and_load(tmp_path):
    fabric = L.Fabric(accelerator="cpu", devices=1, plugins=[FastCheckpointIO()])
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.Adam(model.parameters())
    model, opt = fabric.setup(model, opt)
    for _ in range(3):
        loss = model(torch.randn(4, 8)).sum()
        fabric.backward(loss)
        opt.step()
        opt.zero_grad()
    fabric.save(tmp_path / "f.ckpt", {"model": model, "opt": opt, "step": 3})
    fabric.strategy.checkpoint_io.teardown()
    want = {k: v.clone() for k, v in model.state_dict().items()}
    state = {"model": model, "opt": opt}
    rest = fabric.load(tmp_path / "f.ckpt", state)
    assert rest["step"] == 3
    assert_equal(dict(model.state_dict()), want)


def test_from_hydra_config():
    from hydra import compose, initialize_config_dir
    cfg_dir = CONFIG_DIR
    with initialize_config_dir(config_dir=os.path.abspath(cfg_dir), version_base="1.3"):
        cfg = compose("config", overrides=["strategy=d", "concurrency=3"])
    io = FastCheckpointIO.from_config(cfg)
    opened_with = io.named.settings  # what its Checkpointer opens with
    assert opened_with["strategy"] == "d" and opened_with["concurrency"] == 3


def test_async_checkpoint_io_peer_still_works_alongside(tmp_path):
    # the peer the benchmark compares against, on the same model: same files
    fit(AsyncCheckpointIO(TorchCheckpointIO()), tmp_path / "a", steps=8, every_n_train_steps=4, save_top_k=-1)
    fit(FastCheckpointIO(), tmp_path / "b", steps=8, every_n_train_steps=4, save_top_k=-1)
    assert files(tmp_path / "a") == files(tmp_path / "b")


def test_checkpoints_into_a_pmem_pool_by_path(tmp_path, shm):
    """pool=...: ModelCheckpoint's paths become models of a pool (no files); the same ones
    Lightning's own IO leaves as files, with the same values; removal drops the model;
    resuming from a path reads it back out of the pool."""
    from fastckpt.pmem.pool import Pool
    pool = os.path.join(shm, "lit.pool")
    mc = dict(every_n_train_steps=3, save_last=True, save_top_k=2, monitor="loss")
    _, ref_cb, _ = fit(TorchCheckpointIO(), tmp_path / "ref", **mc)
    io = FastCheckpointIO(pool=pool, pool_mb=64)
    t, cb, _ = fit(io, tmp_path / "fast", **mc)
    assert not os.path.exists(tmp_path / "fast") or files(tmp_path / "fast") == []
    p = Pool(pool, create=False)
    models = sorted(os.path.basename(m) for m in p.models())
    p.close()
    assert models == files(tmp_path / "ref")  # removals dropped what ModelCheckpoint removed
    for name in files(tmp_path / "ref"):
        ref = load(tmp_path / "ref" / name)
        got = FastCheckpointIO(pool=pool).load_checkpoint(tmp_path / "fast" / name)
        ref["callbacks"] = got["callbacks"] = None
        assert_equal(got, ref, name)
    t2 = trainer(FastCheckpointIO(pool=pool), max_steps=30)
    t2.fit(TinyModule(), loader(), loader(), ckpt_path=str(tmp_path / "fast" / "last.ckpt"))
    assert t2.global_step == 30
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        FastCheckpointIO(pool=pool).load_checkpoint(tmp_path / "fast" / "missing.ckpt")


def test_after_teardown_no_optimizer_step_reaches_the_plugin(tmp_path):
    """A finished FastCheckpointIO kept reacting to every optimizer step in the process: an
    unrelated optimizer then opened a Checkpointer, started a reserve thread, and made the next
    trainer.save_checkpoint() return before its file existed."""
    io = FastCheckpointIO()
    t, _, model = fit(io, tmp_path / "run", steps=4, every_n_train_steps=2)
    other = torch.nn.Linear(256, 256)
    opt = torch.optim.Adam(other.parameters())
    for _ in range(3):  # someone else's training, after the run
        other(torch.randn(8, 256)).sum().backward()
        opt.step()
    assert not io.named.opened and io.saves.gate.steps_seen == 0
    assert not [th.name for th in threading.enumerate() if th.name.startswith("fastckpt-reserve")]
    path = tmp_path / "after.ckpt"
    t.save_checkpoint(path)  # outside fit: durable when it returns
    assert os.path.exists(path) and load(path)["global_step"] == 4


def test_a_file_this_plugin_did_not_write_is_removed_at_once(tmp_path):
    """ModelCheckpoint's top-k pruning of a file another IO (or an earlier run) wrote: removing it
    waited for a newer checkpoint of this plugin that never came, not even at teardown."""
    foreign = tmp_path / "epoch=0-step=1.ckpt"
    torch.save({"global_step": 1}, foreign)
    io = FastCheckpointIO()
    io.remove_checkpoint(str(foreign))
    assert not os.path.exists(foreign)
    foreign.write_bytes(b"x")
    io.remove_checkpoint(str(foreign))
    io.teardown()
    assert not os.path.exists(foreign) and files(tmp_path) == []


def test_its_memory_tier_is_a_setting_kept_by_pickle_and_read_from_a_config(shm):
    """tiers and tier_keep are settings: as keywords, or in the config Hydra gives from_config (whose
    other placement fields are Lightning's and dropped); a pickled copy keeps them."""
    import pickle
    memory = os.path.join(shm, "memory")
    io = FastCheckpointIO(tiers=[memory], tier_keep=[2], concurrency=3)
    assert io.named.config.tiers == (memory,) and io.named.config.tier_keep == (2,)
    copy = pickle.loads(pickle.dumps(io))
    assert copy.named.config == io.named.config and repr(copy) == repr(io)
    assert "tiers=('" in repr(io)
    made = FastCheckpointIO.from_config({"tiers": [memory], "tier_keep": [2], "concurrency": 3, "root": "ignored"})
    assert made.named.config == io.named.config
    with pytest.raises(TypeError, match="not both"):
        FastCheckpointIO(settings={"concurrency": 3}, tiers=[memory])


def test_the_plugin_pickles_as_its_settings_for_ddp_spawn(tmp_path):
    """ddp_spawn (and torch.save(trainer)) pickle the trainer with its plugins."""
    import pickle
    io = FastCheckpointIO(concurrency=3, chunk_mb=8)
    copy = pickle.loads(pickle.dumps(io))
    assert copy.named.config == io.named.config and copy is not io and not copy.named.opened
    assert repr(copy) == repr(io) == "FastCheckpointIO(concurrency=3, chunk_mb=8)"
    torch.manual_seed(0)
    cb = ModelCheckpoint(dirpath=str(tmp_path), every_n_train_steps=2, save_top_k=-1)
    t = trainer(FastCheckpointIO(), [cb], max_steps=4, strategy="ddp_spawn", devices=2)
    t.fit(TinyModule(), loader())
    assert sorted(files(tmp_path)) == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt"]
    assert load(tmp_path / "epoch=0-step=4.ckpt")["global_step"] == 4


def test_wrapped_by_async_checkpoint_io_nothing_outlives_fit(tmp_path):
    """AsyncCheckpointIO(FastCheckpointIO()): the wrapper calls save from its own thread and its
    teardown never reaches ours, so the plugin then acts synchronously: every file durable and
    no thread of ours left when fit returns."""
    before = set(threading.enumerate())  # other tests' owners, never closed, may keep idle workers a while
    cb = ModelCheckpoint(dirpath=str(tmp_path), every_n_train_steps=2, save_top_k=-1)
    t = trainer(AsyncCheckpointIO(FastCheckpointIO()), [cb], max_steps=6)
    with pytest.warns(UserWarning, match="already saves asynchronously"):
        t.fit(TinyModule(), loader())
    assert sorted(files(tmp_path)) == [f"epoch=0-step={s}.ckpt" for s in (2, 4, 6)]
    assert load(tmp_path / "epoch=0-step=6.ckpt")["global_step"] == 6
    assert not [th.name for th in threading.enumerate() if th.name.startswith("fastckpt") and th not in before]


def test_a_missing_checkpoint_is_said_in_lightnings_words(tmp_path):
    with pytest.raises(FileNotFoundError, match="Checkpoint file not found"):
        trainer(FastCheckpointIO(), max_steps=1).fit(TinyModule(), loader(), ckpt_path=str(tmp_path / "nope.ckpt"))
