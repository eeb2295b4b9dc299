"""fastckpt.dcp's FastStorageWriter and FastStorageReader under real torch.distributed.checkpoint:
a state saved on 2 gloo ranks (DTensor shards) loads on 1, 2 and 3 ranks, and one saved on 1 or 3
loads on 2, equal to the full state (resharding is DCP's planner's); our checkpoints load with
DCP's stock FileSystemReader and stock checkpoints with ours (one warning); a checkpoint whose
commit never happened, a damaged item, a replaced or hostile `.metadata` are refused with one
line and nothing run."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, as DCP raises it

from fastckpt.commit import record
from fastckpt.dcp import FastStorageReader, FastStorageWriter
from fastckpt.commit.record import COMMIT_NAME as RECORD
from support import warm
from support.paths import ROOT, WORKERS, python_path
from support.processes import free_port

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def run_ranks(mode: str, directory, world: int, *extra, **env) -> list[str]:
    """dcp_worker.py MODE DIRECTORY on `world` gloo ranks (world 0: one process, no group)."""
    port, procs = free_port(), []
    for rank in range(max(world, 1)):
        e = dict(os.environ, PYTHONPATH=python_path(ROOT, WORKERS), **env)
        if world:
            e.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(warm.popen([sys.executable, os.path.join(WORKERS, "dcp_worker.py"), mode, str(directory),
                                 *map(str, extra)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e))
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]
    return outs


def state() -> dict:
    g = torch.Generator().manual_seed(3)
    big = torch.randn(300, 200, generator=g)
    return {"w": big, "half": torch.randn(64, generator=g).half(), "view": torch.arange(100)[10:20],
            "empty": torch.zeros(0), "step": 5, "nested": {"s": "x", "b": torch.ones(2, dtype=torch.bfloat16)}}


def blank() -> dict:
    return {"w": torch.zeros(300, 200), "half": torch.zeros(64).half(), "view": torch.zeros(10, dtype=torch.long),
            "empty": torch.zeros(0), "step": 0, "nested": {"s": "", "b": torch.zeros(2, dtype=torch.bfloat16)}}


def same(a: dict, b: dict) -> bool:
    return all(same(a[k], v) if isinstance(v, dict) else
               (torch.equal(a[k], v) and a[k].dtype == v.dtype) if isinstance(v, torch.Tensor) else a[k] == v
               for k, v in b.items())


def save(directory, **settings) -> None:
    writer = FastStorageWriter(directory, step=5, **settings)
    try:
        dcp.save(state(), storage_writer=writer)
    finally:
        writer.close()


def test_a_state_round_trips_and_commits_every_file_with_its_crc(tmp_path):
    save(tmp_path / "c", chunk_mb=1, writers=2)
    assert sorted(os.listdir(tmp_path / "c")) == sorted([".metadata", "__0_0.distcp", RECORD])
    info = record.read(str(tmp_path / "c"), RECORD, every_rank=False)
    assert {f.name for f in info.files} == {".metadata", "__0_0.distcp"} and info.step == 5 and info.counter == 1
    assert next(f for f in info.files if f.name == "__0_0.distcp").spans  # chunk CRCs for verify
    out = blank()
    dcp.load(out, storage_reader=FastStorageReader(tmp_path / "c"))
    assert same(out, state())


def test_our_checkpoint_loads_with_dcps_stock_reader_and_theirs_with_ours(tmp_path):
    save(tmp_path / "ours")
    out = blank()
    dcp.load(out, storage_reader=dcp.FileSystemReader(tmp_path / "ours"))
    assert same(out, state())
    dcp.save(state(), storage_writer=dcp.FileSystemWriter(tmp_path / "theirs"))
    with pytest.warns(UserWarning, match="no fastckpt commit record"):
        out = blank()
        dcp.load(out, storage_reader=FastStorageReader(tmp_path / "theirs"))
    assert same(out, state())
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # once is enough
        warnings.filterwarnings("ignore", "torch.distributed is disabled")
        dcp.load(blank(), storage_reader=FastStorageReader(tmp_path / "theirs"))


def test_items_stored_as_the_tensors_asked_for_are_read_into_them_the_rest_staged(tmp_path, monkeypatch):
    import fastckpt.dcp.reader as reader_module
    staged = []
    real = reader_module.read_archives
    monkeypatch.setattr(reader_module, "read_archives", lambda path, idx, *a: staged.append(len(idx)) or real(path, idx, *a))
    save(tmp_path / "c")
    out = blank()
    ptrs = {k: v.data_ptr() for k, v in out.items() if isinstance(v, torch.Tensor) and v.numel()}
    dcp.load(out, storage_reader=FastStorageReader(tmp_path / "c"))
    assert same(out, state()) and staged == []  # every tensor read in place, none staged
    assert all(out[k].data_ptr() == p for k, p in ptrs.items())
    out = blank()
    out["w"] = torch.zeros(200, 300).t()  # not contiguous: staged, then copied
    out["half"] = torch.zeros(64)  # another dtype: staged, converted as DCP's reader converts
    dcp.load(out, storage_reader=FastStorageReader(tmp_path / "c"))
    assert staged == [2] and torch.equal(out["w"], state()["w"]) and torch.equal(out["half"], state()["half"].float())
    data = tmp_path / "c" / "__0_0.distcp"
    raw = bytearray(data.read_bytes())
    big = next(f for f in record.read(str(tmp_path / "c"), RECORD, every_rank=False).files if f.name == data.name)
    _, off, length, _ = max(big.spans, key=lambda s: s[2])  # the largest span: w's data
    raw[off + length // 2] ^= 0x01
    data.write_bytes(bytes(raw))
    for target in (torch.zeros(300, 200), torch.zeros(200, 300).t()):  # in place, staged
        out = blank()
        out["w"] = target
        with pytest.raises(CheckpointException, match=r"DCP item 'w': .*CRC-32"):
            dcp.load(out, storage_reader=FastStorageReader(tmp_path / "c"))


def test_a_checkpoint_whose_commit_never_happened_is_not_loaded(tmp_path):
    save(tmp_path / "c")
    os.remove(tmp_path / "c" / RECORD)  # killed after .metadata, before the record
    with pytest.raises(CheckpointException, match="never committed"):
        dcp.load(blank(), storage_reader=FastStorageReader(tmp_path / "c"))


def test_a_damaged_item_a_replaced_metadata_and_a_hostile_one_are_refused(tmp_path):
    save(tmp_path / "c")
    data = tmp_path / "c" / "__0_0.distcp"
    raw = bytearray(data.read_bytes())
    info = record.read(str(tmp_path / "c"), RECORD, every_rank=False)
    entry = next(f for f in info.files if f.name == "__0_0.distcp")
    _, off, length, _ = entry.spans[len(entry.spans) // 2]
    raw[off + length // 2] ^= 0x01
    data.write_bytes(bytes(raw))
    with pytest.raises(CheckpointException, match=r"DCP item '(w|half|view|nested\.b)': .*CRC-32"):  # named by its key
        dcp.load(blank(), storage_reader=FastStorageReader(tmp_path / "c"))
    save(tmp_path / "m")
    meta = tmp_path / "m" / ".metadata"
    meta.write_bytes(meta.read_bytes().replace(b"__0_0.distcp", b"__0_0.distcq"))  # still a valid pickle
    with pytest.raises(CheckpointException, match="not the one its commit record names"):
        dcp.load(blank(), storage_reader=FastStorageReader(tmp_path / "m"))
    save(tmp_path / "h")
    os.remove(tmp_path / "h" / RECORD)
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (tmp_path / "h" / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(CheckpointException, match="refusing to load global"):
        dcp.load(blank(), storage_reader=FastStorageReader(tmp_path / "h"))
    assert not marker.exists()


def test_a_damaged_pickle_of_an_item_read_in_place_is_refused_though_it_is_read_once(tmp_path):
    """An item read straight into its tensor has its data.pkl read once, by the structure check,
    whose bytes' CRC-32 the verified read takes instead of reading it again: a flipped bit there
    ('cpu' -> 'cPu', which still unpickles) fails the CRC check, naming the item and the record."""
    save(tmp_path / "c")
    data = tmp_path / "c" / "__0_0.distcp"
    raw = data.read_bytes()
    at = raw.index(b"cpu")
    data.write_bytes(raw[:at] + b"cPu" + raw[at + 3:])
    with pytest.raises(CheckpointException, match=r"DCP item '(w|half|view|empty|nested\.b)': .*data\.pkl.*CRC-32"):
        dcp.load(blank(), storage_reader=FastStorageReader(tmp_path / "c"))
    dcp.load(blank(), storage_reader=FastStorageReader(tmp_path / "c", verify=False))  # the structure is whole


@pytest.mark.parametrize("saved_on, loaded_on", [(2, 0), (2, 2), (2, 3), (1, 2), (3, 2)])
def test_saved_on_some_ranks_loads_resharded_on_others(tmp_path, saved_on, loaded_on):
    """1 <-> 2 <-> 3 ranks; loaded_on 0: one process without a process group (plain full tensors)."""
    run_ranks("save", tmp_path / "c", saved_on)
    info = record.read(str(tmp_path / "c"), RECORD, every_rank=False)
    assert info.world_size == saved_on
    assert {f.name for f in info.files} == {".metadata"} | {f"__{r}_0.distcp" for r in range(saved_on)}
    outs = run_ranks("load", tmp_path / "c", loaded_on)
    for rank, out in enumerate(outs):
        assert f"rank {rank} EQUAL" in out, out[-3000:]


def test_saved_on_two_ranks_loads_with_the_stock_reader_on_three(tmp_path):
    run_ranks("save", tmp_path / "c", 2)
    for rank, out in enumerate(run_ranks("load", tmp_path / "c", 3, READER="stock")):
        assert f"rank {rank} EQUAL" in out, out[-3000:]


def test_a_byte_item_that_would_run_code_is_refused_before_dcps_planner_unpickles_it(tmp_path, capsys):
    """DCP's load planner unpickles byte items with torch.load(weights_only=False); ours checks the
    pickle first. A checkpoint of DCP's own writer (no record needed) carrying a payload."""
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    dcp.save({"w": torch.ones(3), "extra": Payload()}, storage_writer=dcp.FileSystemWriter(tmp_path / "h"))
    assert not marker.exists()
    with pytest.raises(CheckpointException, match="DCP item 'extra'.*refusing to load global"):
        dcp.load({"w": torch.zeros(3), "extra": None}, storage_reader=FastStorageReader(tmp_path / "h"))
    assert not marker.exists()
    from fastckpt.tools.cli import main
    assert main(["verify", str(tmp_path / "h")]) == 0  # intact: verify says UNSAFE, runs nothing
    assert "UNSAFE to load as it is" in capsys.readouterr().out and not marker.exists()


def test_saving_again_into_a_committed_directory_withdraws_it_before_any_write(tmp_path, monkeypatch):
    save(tmp_path / "c")
    from fastckpt.dcp import writer as writer_module
    seen = {}
    real = writer_module.FastStorageWriter.write_data

    def write_data(self, plan, planner):  # what a crash at the first write would leave
        seen["files"] = sorted(os.listdir(self.path))
        return real(self, plan, planner)

    monkeypatch.setattr(writer_module.FastStorageWriter, "write_data", write_data)
    save(tmp_path / "c")
    assert RECORD not in seen["files"] and ".metadata" not in seen["files"], seen
    out = blank()
    dcp.load(out, storage_reader=FastStorageReader(tmp_path / "c"))  # and the new one commits
    assert same(out, state())


def test_a_save_that_fills_the_disk_fails_on_every_rank_and_leaves_no_file_of_it(mount_tmpfs):
    """2 gloo ranks save a 1 MiB sharded state per step into a 2.5 MiB filesystem: step 3 does not
    fit. It fails on both ranks (no hang); no file of it is left, on any rank; step 2 is the newest
    to resume from and loads bit-exact."""
    from fastckpt.dcp import newest_committed
    disk = mount_tmpfs(5 << 19)
    outs = run_ranks("fill", disk, 2)
    for rank, out in enumerate(outs):
        assert f"rank {rank} saved 2" in out and f"rank {rank} failed 3" in out, out[-3000:]
    assert "No space left" in "".join(outs) or "ENOSPC" in "".join(outs), outs
    assert sorted(os.listdir(disk)) == ["step-1", "step-2"], sorted(os.listdir(disk))  # step-3: nothing
    newest = newest_committed(disk)
    assert (os.path.basename(newest), newest.step, newest.by) == ("step-2", 2, "fastckpt")
    assert all(f"rank {r} EQUAL" in out for r, out in enumerate(run_ranks("load-step", disk, 2, 2)))


def test_an_async_save_without_a_process_group_lands_beside_training_collectives(tmp_path):
    """On 2 ranks, dcp.async_save(..., async_stager=FastStager(...)) as DCP documents it, with no
    process_group, lands while training's all-reduces run on a group of their own (the stager's
    and the writer's agreements touch no group of the caller's); with process_group=save_group()
    it lands while they run on the default group. Training all-reduces for as long as a save is in
    flight (at least one of them beside it), every sum right. Both load back equal."""
    import re
    from fastckpt.dcp import newest_committed
    outs = run_ranks("group", tmp_path, 2)
    for rank, out in enumerate(outs):
        for step in (1, 2):
            beside = re.search(rf"rank {rank} reduced {step} beside (\d+)", out)
            assert f"rank {rank} saved {step}" in out and beside and int(beside.group(1)) >= 1, out[-3000:]
    assert (newest_committed(tmp_path).step, newest_committed(tmp_path).by) == (2, "fastckpt")
    for step in (1, 2):
        assert all(f"rank {r} EQUAL" in out for r, out in enumerate(run_ranks("load-step", tmp_path, 2, step)))


@pytest.mark.parametrize("loaded_on", [0, 2, 3])
def test_through_a_memory_tier_each_file_is_persisted_and_a_resharded_load_reads_the_memory_copies(
        tmp_path, shm, loaded_on):
    """FastStorageWriter(tiers=[memory]) on 2 ranks: every rank's file commits in its memory folder and
    is persisted to the checkpoint's directory before the record is written (the record's files are
    there, and DCP's stock reader loads them); FastStorageReader(tiers=[memory]) on 1, 2 or 3 ranks
    reads every file it needs (its own rank's and others') from its memory copy."""
    memory = os.path.join(shm, "memory")
    run_ranks("save", tmp_path / "c", 2, TIERS=memory)
    info = record.read(str(tmp_path / "c"), RECORD, every_rank=False)
    for f in info.files:
        assert os.path.getsize(tmp_path / "c" / f.name) == f.bytes, f.name
    assert sorted(os.listdir(memory)) == ["rank-0", "rank-1"]
    for rank, out in enumerate(run_ranks("load", tmp_path / "c", loaded_on, TIERS=memory)):
        assert f"rank {rank} EQUAL" in out and f"rank {rank} READ memory\n" in out, out[-3000:]


def test_a_damaged_memory_copy_of_a_dcp_file_is_named_and_the_file_is_read(tmp_path, shm):
    memory = os.path.join(shm, "memory")
    run_ranks("save", tmp_path / "c", 2, TIERS=memory)
    folder = os.path.join(memory, "rank-1")
    (step,) = [n for n in os.listdir(folder) if n.startswith("step-")]
    part = os.path.join(folder, step, "rank-0.pt")
    with open(part, "r+b") as f:
        f.seek(os.path.getsize(part) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    out, = run_ranks("load", tmp_path / "c", 0, TIERS=memory)
    assert "rank 0 EQUAL" in out and "rank 0 READ disk,memory" in out, out[-3000:]
    assert "does not verify" in out and part in out and "__1_0.distcp" in out, out[-3000:]


def test_the_docs_dcp_tier_calls_are_the_ones_the_worker_makes():
    """docs/tiers.md's DCP block runs as written (test_first_hour); its FastStorageWriter and
    FastStorageReader calls, with their keyword names, are ones tests/workers/dcp_worker.py makes."""
    from support import readme_blocks
    missing = readme_blocks.calls_not_in(os.path.join(ROOT, "docs", "tiers.md"), "In front of DCP's files (FSDP2, torchtitan)",
                                         "", os.path.join(WORKERS, "dcp_worker.py"), ("FastStorageWriter", "FastStorageReader"))
    assert not missing, missing
