"""The pmem store: a pool of models' versions, double mapping, repack, export, kill -9.

Pools live on /dev/shm (ordinary memory here, persisted by msync) and are also run with
persist="fence", the path real PMEM takes (non-temporal stores, cache-line write-back,
store fence), which works on any mapping. The GPU zero-copy path is under @pytest.mark.gpu.
"""
from __future__ import annotations

import filecmp
import os
import random
import subprocess
import sys

import pytest
import torch

import fastckpt
from fastckpt import _native
from fastckpt.tools.cli import main as cli_main
from fastckpt.errors import CheckpointWriteError, ConfigError, CorruptCheckpointError, NoCheckpointError
from fastckpt.pmem import layout as L
from fastckpt.pmem.pool import Pool
from support import warm
from support.states import assert_same, assert_sharing, state_matrix
from support.processes import kill_at_random

from workers.crash_child import state_for  # noqa: E402


def pool_ck(path, **kw) -> fastckpt.Checkpointer:
    kw.setdefault("pool_mb", 64)
    return fastckpt.Checkpointer(path, store="pmem", **kw)


def test_a_strategy_other_than_the_default_is_said_to_change_nothing_in_a_pool(shm):
    """The pool is the staging: every strategy stores straight into it, so 'g' or 'd' asked of
    a pool is warned about (and the save is the same); the default 'c' is not."""
    import warnings
    for strategy in ("g", "d"):
        with pytest.warns(UserWarning, match=f"store='pmem' stores every snapshot straight into the pool .*"
                                             f"strategy='{strategy}' changes nothing there"):
            ck = pool_ck(os.path.join(shm, strategy), model="m", strategy=strategy)
        with ck:
            ck.save({"w": torch.arange(8.0)}, step=1).wait()
            assert torch.equal(ck.load()["w"], torch.arange(8.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pool_ck(os.path.join(shm, "c"), model="m").close()


@pytest.mark.parametrize("persist", ["msync", "fence"])
@pytest.mark.parametrize("strategy", ["c", "d"])
def test_roundtrip_of_the_state_matrix(shm, persist, strategy):
    state = state_matrix()
    with pool_ck(os.path.join(shm, "p"), persist=persist, strategy=strategy) as ck:
        ck.save(state, step=7).wait()
        assert ck.store.pool.persist_name.startswith(persist)
        out = ck.load()
    assert_same(state, out)
    assert_sharing(out)


def test_export_is_the_file_store_s_bytes_and_tensors(shm, tmp_path):
    state = state_matrix()
    pool = os.path.join(shm, "p")
    with pool_ck(pool, model="m") as ck:
        ck.save(state, step=3).wait()
    with fastckpt.Checkpointer(tmp_path / "st", format="safetensors") as ck:
        ck.save(state, step=3).wait()
        st_file = ck.latest().file_for(0)
    with fastckpt.Checkpointer(tmp_path / "pt") as ck:
        ck.save(state, step=3).wait()
        pt_file = ck.latest().file_for(0)
    out = str(tmp_path / "out.safetensors")
    assert cli_main(["export", pool, out, "--model", "m", "--to", "safetensors"]) == 0
    assert filecmp.cmp(out, st_file, shallow=False)  # byte for byte
    out_pt = str(tmp_path / "out.pt")
    assert cli_main(["export", pool, out_pt, "--to", "torch"]) == 0
    assert_same(fastckpt.load(pt_file), torch.load(out_pt, weights_only=True))


def test_double_mapping_alternates_two_slots_and_keeps_the_previous_version(shm):
    pool_path = os.path.join(shm, "p")
    with pool_ck(pool_path, concurrency=1) as ck:
        slots = []
        for step in range(1, 6):
            ck.save(state_for(step), step=step).wait()
            vs = ck.store.pool.versions("default")
            slots.append([v.slot for v in vs if v.active][0])
            assert [v.step for v in vs] == ([step, step - 1] if step > 1 else [step])
        assert slots == [0, 1, 0, 1, 0]
        assert [i.step for i in ck.list()] == [5, 4]


def test_a_damaged_current_version_falls_back_to_the_previous_one(shm):
    pool_path = os.path.join(shm, "p")
    with pool_ck(pool_path, concurrency=1) as ck:
        for step in (1, 2):
            ck.save(state_for(step), step=step).wait()
        cur = [v for v in ck.store.pool.versions("default") if v.active][0]
        ck.store.pool.view[cur.desc.data_off + 100] ^= 0xFF  # one flipped byte in its data
        with pytest.warns(UserWarning, match="loaded step 1; passed over"):
            out = ck.load()
    assert_same(state_for(1), out)
    assert cli_main(["verify", pool_path]) == 1


def test_a_torn_descriptor_or_active_word_never_loses_a_version(shm):
    pool_path = os.path.join(shm, "p")
    with pool_ck(pool_path, concurrency=1) as ck:
        for step in (1, 2):
            ck.save(state_for(step), step=step).wait()
        pool = ck.store.pool
        i = pool.find("default")
        cur = [v for v in pool.versions("default") if v.active][0]
        pool.view[L.slot_off(i, cur.slot) + 9] ^= 0x01  # the current slot's descriptor is torn
        assert ck.load()["step"] == 1
        pool.native.store8(L.entry_off(i) + 8, 0)  # the active word is gone too
        assert ck.latest() is None  # nothing is vouched for: no active word anywhere
        pool.native.store8(L.entry_off(i) + 8, L.pack_active(cur.counter, cur.slot))


def test_models_share_a_pool_and_repack_reclaims_dropped_and_stale_space(shm):
    pool_path = os.path.join(shm, "p")
    for m in ("a", "b", "c"):
        with pool_ck(pool_path, model=m, concurrency=2) as ck:
            for step in range(1, 4):
                ck.save(state_for(step), step=step).wait()
    pool = Pool(pool_path, create=False)
    assert sorted(pool.models()) == ["a", "b", "c"]
    free = pool.free_bytes()
    pool.close()
    assert cli_main(["repack", pool_path, "--drop", "b"]) == 0
    pool = Pool(pool_path, create=False)
    assert sorted(pool.models()) == ["a", "c"]
    assert pool.free_bytes() > free + 5 * (1 << 20)  # model b (3 versions) + 4 stale versions
    assert all(len(pool.versions(m)) == 1 for m in ("a", "c"))
    pool.close()
    for m in ("a", "c"):
        with pool_ck(pool_path, model=m) as ck:
            assert_same(state_for(3), ck.load())
    assert cli_main(["ls", pool_path]) == 0
    assert cli_main(["verify", pool_path]) == 0


_CLAIMER = """
import sys, time
from fastckpt.pmem.pool import Pool
pool = Pool(sys.argv[1], create=False)
i = pool.ensure_model("m")
pool.claim(i, 2, set(), 4096, 4 << 20)  # a version's room taken; its bytes never come
print("claimed", flush=True)
time.sleep(600)
"""


def test_repack_reclaims_a_version_whose_writer_was_killed_and_leaves_a_live_one(shm):
    """A slot claimed and never sealed (the writer killed with kill -9) used to keep its room
    until its model was dropped. Its writer's lock died with it: repack reclaims the room,
    while a claim whose writer still lives (here, in this very process) is left alone."""
    pool_path = os.path.join(shm, "p")
    with pool_ck(pool_path, model="m", concurrency=1) as ck:
        ck.save(state_for(1), step=1).wait()
    child = warm.popen([sys.executable, "-c", _CLAIMER, pool_path], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "claimed"
        pool = Pool(pool_path, create=False)
        free = pool.free_bytes()
        assert pool.repack()["torn"] == 0  # its writer lives: nothing reclaimed
        assert pool.free_bytes() == free
    finally:
        child.kill()  # SIGKILL
        child.wait()
    r = pool.repack()
    assert r["torn"] == 1 and pool.free_bytes() >= free + (4 << 20)
    i = pool.ensure_model("live")
    s, _ = pool.claim(i, 2, set(), 4096, 1 << 20)  # a writer of this process, another open of the pool
    other = Pool(pool_path, create=False)
    assert other.repack()["torn"] == 0
    other.close()
    pool.close()
    with pool_ck(pool_path, model="m") as ck:
        assert_same(state_for(1), ck.load())  # the current version was never touched
    assert cli_main(["verify", pool_path]) == 0


def test_a_full_pool_is_a_clear_error_and_the_current_version_survives(shm):
    pool_path = os.path.join(shm, "p")
    with pool_ck(pool_path, pool_mb=6, concurrency=1) as ck:
        ck.save(state_for(1), step=1).wait()
        big = {"w": torch.randn(2 << 20)}  # 8 MiB: cannot fit
        ck.save(state_for(2), step=2).wait()
        with pytest.raises(CheckpointWriteError, match="pool .* is full"):
            ck.save(big, step=3).wait()
        assert [i.step for i in ck.list()] == [2, 1]  # neither the current nor the previous one is touched
        assert_same(state_for(2), ck.load())


def test_bad_input_gets_a_clear_error(shm, tmp_path):
    with pytest.raises(ConfigError, match="concurrency 1..7"):
        fastckpt.Checkpointer(os.path.join(shm, "p"), store="pmem", concurrency=8)
    with pytest.raises(ConfigError, match="unknown persist"):
        fastckpt.Checkpointer(os.path.join(shm, "p"), store="pmem", persist="sometimes").save({"x": torch.ones(1)}, step=1)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        fastckpt.Checkpointer(str(tmp_path / "missing" / "p"), store="pmem").save({"x": torch.ones(1)}, step=1)
    not_a_pool = tmp_path / "junk"
    not_a_pool.write_bytes(b"x" * 8192)
    with pytest.raises(CorruptCheckpointError, match="not a fastckpt pool"):
        Pool(not_a_pool, create=False)
    with pytest.raises(NoCheckpointError):
        pool_ck(os.path.join(shm, "empty")).load()
    with pytest.raises(ValueError, match="model names"):
        fastckpt.Checkpointer(os.path.join(shm, "p"), store="pmem", model="")


def test_fastckpt_info_reports_the_persistence_in_force(shm, capsys):
    for persist, word in (("msync", "msync"), ("fence", "fence (")):
        path = os.path.join(shm, persist)
        with pool_ck(path, persist=persist) as ck:
            ck.save({"x": torch.ones(3)}, step=1).wait()
        os.environ["FASTCKPT_PMEM_PERSIST"] = persist
        try:
            assert cli_main(["info", path]) == 0
        finally:
            del os.environ["FASTCKPT_PMEM_PERSIST"]
        assert f"pool persist: {word}" in capsys.readouterr().out


def test_held_saves_copy_only_released_records(shm):
    state = {"a": torch.randn(1000), "b": torch.randn(1000)}
    want = {k: v.clone() for k, v in state.items()}
    with pool_ck(os.path.join(shm, "p")) as ck:
        p = ck.save(state, step=1, held=True)
        names = [r.name for r in p.plan.records]
        p.write.release([names.index("a")])
        assert p.write.wait_records([names.index("a")], timeout=30)
        state["a"].add_(1)  # copied already: this must not reach the checkpoint
        p.release_all()
        p.wait()
        assert_same(want["a"], ck.load()["a"])


def test_hydra_store_pmem_builds_a_pool_checkpointer(shm):
    from fastckpt.config.hydra import instantiate
    ck = instantiate({"root": os.path.join(shm, "p"), "store": {"name": "pmem", "model": "m", "pool_mb": 16,
                                                                   "persist": "fence"}, "concurrency": 3})
    with ck:
        ck.save({"x": torch.arange(5)}, step=2).wait()
        assert ck.store.slots == 4 and ck.store.pool.persist_name.startswith("fence")
        assert ck.load()["x"].tolist() == [0, 1, 2, 3, 4]


def run_and_kill(pool: str, rng: random.Random, concurrency: int, persist: str) -> dict:
    committed: dict = {}

    def on_line(line: str) -> None:
        if line.startswith("committed"):
            _, m, step = line.split()
            committed[m] = max(committed.get(m, 0), int(step))

    kill_at_random("pmem_crash_child.py", [pool, str(concurrency), persist], rng, 0.5, on_line)
    return committed


def test_kill9_while_two_models_checkpoint_into_one_pool(shm, many):
    """After each kill the pool opens; each model's newest loadable version verifies, equals
    the state saved at its step, and is the newest reported committed or a newer one whose
    commit was not reported yet (at most `concurrency` ahead)."""
    rng = random.Random(5)
    pool = os.path.join(shm, "pool")
    best: dict = {}
    for i in range(1000 if many else 30):
        concurrency = 1 + i % 3
        persist = ("msync", "fence", "auto")[i % 3]  # auto: libpmem2 where it was built in
        reported = run_and_kill(pool, rng, concurrency, persist)
        for m in ("alpha", "beta"):
            best[m] = max(best.get(m, 0), reported.get(m, 0))
            with fastckpt.Checkpointer(pool, store="pmem", model=m) as ck:
                info = ck.latest()
                if info is None:
                    assert best[m] == 0, f"kill {i}: model {m} lost every version (step {best[m]} was committed)"
                    continue
                assert best[m] <= info.step <= best[m] + 3, f"kill {i}: {m} at step {info.step}, reported {best[m]}"
                assert_same(state_for(info.step), ck.load())
                best[m] = info.step
    assert cli_main(["verify", pool]) == 0


@pytest.mark.skipif(not _native.features()["libpmem2"], reason="built without libpmem2 (no libpmem2-dev)")
def test_libpmem2_maps_the_pool_and_its_forced_granularity_takes_the_fence_path(shm, monkeypatch):
    state = state_matrix()
    for force, word in ((None, "libpmem2 (page"), ("CACHE_LINE", "libpmem2 (cache line")):
        if force:
            monkeypatch.setenv("PMEM2_FORCE_GRANULARITY", force)
        path = os.path.join(shm, f"lib-{force}")
        with pool_ck(path) as ck:
            ck.save(state, step=1).wait()
            assert ck.store.pool.persist_name.startswith(word), ck.store.pool.persist_name
            assert_same(state, ck.load())


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", ["c", "g", "d"])
def test_cuda_tensors_go_straight_into_the_registered_pool(shm, strategy):
    state = state_matrix("cuda")
    with pool_ck(os.path.join(shm, "p"), strategy=strategy, stall_timeout_s=30) as ck:
        for step in (1, 2, 3):  # the third reuses the first one's slot
            p = ck.save(state, step=step)
            assert p.write.mode == "pool-registered"
            ck.gate()
            p.wait()
            out = ck.load(map_location="cuda")
            assert_same(state, out)
            state["big"].add_(1)


def test_path_named_models_load_drop_and_repack_by_directory(shm, tmp_path):
    pool_path = os.path.join(shm, "p")
    a, b = str(tmp_path / "tag1" / "x.pt"), str(tmp_path / "tag2" / "x.pt")
    with pool_ck(pool_path, model=None) as ck:
        for step, path in ((1, a), (2, b)):
            ck.save(state_for(step), step=step, path=path).wait()
        with pytest.raises(ValueError, match="needs save"):
            ck.save(state_for(3), step=3)
        assert_same(state_for(2), ck.store.load_named(b))
        assert ck.store.named_size(a) == [v for v in ck.store.pool.versions(a)][0].nbytes
    assert cli_main(["repack", pool_path, "--drop-under", str(tmp_path / "tag1")]) == 0
    pool = Pool(pool_path, create=False)
    assert sorted(pool.models()) == [b]
    pool.close()
    with pool_ck(pool_path, model=None) as ck:
        with pytest.raises(FileNotFoundError, match="no checkpoint"):
            ck.store.load_named(a)
        ck.store.drop_named(b)
        assert ck.store.named_size(b) is None
