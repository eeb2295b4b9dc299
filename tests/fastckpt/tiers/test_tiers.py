"""A memory tier in front of the disk, one process: what a save leaves on each tier, retention per
tier, recycled memory, the memory bound, and the settings.

(Kills, wiped and damaged tiers, and partner replicas on 2 ranks: test_tiers_campaign.py; SIGTERM:
test_preempt.py; the store conformance suite runs the tiered store too.)
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import types
import warnings

import pytest
import torch

import fastckpt
from fastckpt import _native
from fastckpt.errors import ConfigError, CorruptCheckpointError
from fastckpt.named import NamedCheckpoints
from fastckpt.settings import CheckpointerConfig
from fastckpt.store import tier_copy
from fastckpt.store.node_tier import SPARE
from support.states import assert_same, state_matrix


def state(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(256, 1024, generator=g), "step": step}


@pytest.fixture
def tiers(tmp_path, shm):
    return [os.path.join(shm, "memory"), str(tmp_path / "disk")]


def test_a_save_commits_on_the_memory_tier_and_is_persisted_to_the_disk_byte_for_byte(tiers):
    with fastckpt.Checkpointer(tiers=tiers, tier_keep=[2, 3]) as ck:
        for step in range(1, 6):
            ck.save(state(step), step)
            ck.gate()
        ck.wait()
        held = ck.store.holding()
        assert ck.stats["persisted"] + ck.stats["persist_superseded"] == 5 and ck.stats["persisted"] >= 1
        # tmpfs: each part stored through a mapping of its file (staged, as the strategy says)
        assert ck.store.sink_kind == "memory" and ck.stats["modes"] == {"staged (memory-mapped)": 5}
    assert [s for s, places in held.items() if tiers[0] in places] == [5, 4]  # the memory tier keeps 2
    on_disk = [s for s, places in held.items() if tiers[1] in places]
    assert on_disk[0] == 5 and len(on_disk) <= 3  # the newest is always copied; the disk keeps 3
    mem = os.path.join(tiers[0], "rank-0")
    name = sorted(n for n in os.listdir(mem) if n.startswith("step-"))[-1]
    with open(os.path.join(mem, name, "rank-0.pt"), "rb") as a, open(os.path.join(tiers[1], name, "rank-0.pt"), "rb") as b:
        assert a.read() == b.read()
    with fastckpt.Checkpointer(tiers[1]) as disk_only:  # the disk tier is an ordinary root
        assert_same(state(5), disk_only.load())


def test_persist_every_persists_every_nth_memory_checkpoint_and_close_persists_the_newest(tiers):
    """persist_every=3: each save commits on the memory tier; steps 3 and 6 are persisted (the
    counting is in commit order), the others stay in memory alone; close() persists the newest
    (7), which the cadence had left in memory."""
    with fastckpt.Checkpointer(tiers=tiers, tier_keep=[10, 10], persist_every=3) as ck:
        for step in range(1, 8):
            ck.save(state(step), step).wait()
            ck.wait()  # its copy behind, when it has one, landed
        held = ck.store.holding()
        assert [s for s, places in held.items() if tiers[0] in places] == [7, 6, 5, 4, 3, 2, 1]
        assert [s for s, places in held.items() if tiers[1] in places] == [6, 3]
        assert (ck.stats["persisted"], ck.stats["persist_skipped"]) == (2, 5)
    with fastckpt.Checkpointer(tiers[1]) as disk_only:
        assert [i.step for i in disk_only.list()] == [7, 6, 3]
        assert_same(state(7), disk_only.load())
    with fastckpt.Checkpointer(tiers=tiers, tier_keep=[10, 10], persist_every=3) as ck:
        ck.save(state(8), 8).wait()  # the count starts afresh: 8 is owed, then persisted at close
    with fastckpt.Checkpointer(tiers[1]) as disk_only:
        assert disk_only.latest().step == 8


def test_a_first_tier_on_a_disk_is_written_as_any_file(tmp_path):
    """A node-local disk in front of a shared one: its parts are files, O_DIRECT where it takes it."""
    with fastckpt.Checkpointer(tiers=[str(tmp_path / "local"), str(tmp_path / "shared")]) as ck:
        ck.save(state(1), 1).wait()
        assert ck.store.sink_kind == "file" and ck.stats["modes"] == {"staged": 1}
        assert_same(state(1), ck.load())


def test_the_memory_tier_is_recycled_and_a_recycled_part_holds_no_byte_of_the_old_one(tiers):
    """Parts written over a file filled with 0xA5 and over one filled with 0x5A (twice as long) end
    the same length, and no byte where they differ is those two fills: every byte was written."""
    fills = []
    for fill in (0xA5, 0x5A):
        shutil.rmtree(tiers[0], ignore_errors=True)
        with fastckpt.Checkpointer(tiers=tiers) as ck:
            ck.save(state_matrix(), 1).wait()
            info = ck.latest()
            spare = os.path.join(tiers[0], "rank-0", SPARE)
            os.makedirs(spare, exist_ok=True)
            with open(os.path.join(spare, "old"), "wb") as f:
                f.write(bytes([fill]) * (2 * info.bytes))
            ck.save(state_matrix(), 2).wait()
            assert ck.store.tiers[0].recycled == 1
            fills.append(open(ck.store.tiers[0].committed()[0].file_for(0), "rb").read())
            assert_same(state_matrix(), ck.load())
    a, b = fills
    assert len(a) == len(b)
    stale = [i for i in range(len(a)) if (a[i], b[i]) == (0xA5, 0x5A)]
    assert stale == [], f"bytes {stale[:8]} were never written"


def test_parts_are_persisted_and_recycled_through_the_mappings_their_saves_left_held(tiers, monkeypatch):
    """A memory tier's part files stay mapped from one save to the next (the native memory_maps.h):
    the copy to the disk reads each part where its save wrote it (it maps nothing itself), a recycled
    part is written into the mapping it already had, a wiped tier's mappings go at the next room
    check (their memory freed), and none is held once the checkpointer is closed."""
    mapped = []
    real = tier_copy.mmap
    monkeypatch.setattr(tier_copy, "mmap", types.SimpleNamespace(
        mmap=lambda *a, **k: mapped.append(a) or real.mmap(*a, **k), MAP_SHARED=real.MAP_SHARED,
        MAP_POPULATE=getattr(real, "MAP_POPULATE", 0), PROT_READ=real.PROT_READ))
    _native.purge_memory_maps(True)
    with fastckpt.Checkpointer(tiers=tiers, tier_keep=[1, 1]) as ck:
        for step in range(1, 6):
            ck.save(state(step), step)
            ck.wait()  # persisted
            part = ck.store.tiers[0].committed()[0].file_for(0)
            at = _native.find_memory_map(part, os.path.getsize(part))
            assert at, f"step {step}: its part is not held mapped"
            _native.give_back_memory_map(at)
        assert ck.stats["persisted"] == 5 and mapped == []
        assert ck.store.tiers[0].recycled >= 3
        assert 1 <= _native.held_memory_maps() <= 2  # the part in memory and its spare: recycled, not new
        assert_same(state(5), ck.load())
        shutil.rmtree(tiers[0])
        ck.store.tiers[0].free_bytes()
        assert _native.held_memory_maps() == 0
        ck.save(state(6), 6).wait()
        assert _native.held_memory_maps() == 1
    assert _native.held_memory_maps() == 0


class _WhatIHold(torch.utils.data.Dataset):
    """Each item: the files under `under` that the process serving it holds open or mapped."""

    def __init__(self, under: str):
        self.under = os.path.realpath(under)

    def __len__(self):
        return 1

    def __getitem__(self, i):
        held = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                held.add(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass
        with open("/proc/self/maps") as maps:
            held.update(line.split(None, 5)[-1].strip() for line in maps if len(line.split(None, 5)) == 6)
        return sorted(h for h in held if h.startswith(self.under))


def test_a_forked_data_loader_worker_holds_no_memory_tier_file(tiers):
    """The parts' mappings (and the descriptors that pin their files) are held from one save to the
    next; a process forked meanwhile (a DataLoader's worker, alive for the whole run) must inherit
    neither, or every part the tier deletes stays allocated in memory until the worker exits. (A
    fork while a part is written: native/tests/test_memory_file_sink.cc. A fork while the copy to
    the disk checks a part can still inherit the descriptor that check reads the part's index
    through: test_the_copy_to_the_disk_checks_a_part_where_its_save_left_it_and_never_opens_it.)"""
    with fastckpt.Checkpointer(tiers=tiers, tier_keep=[1, 1]) as ck:
        for step in range(1, 4):
            ck.save(state(step), step).wait()
        ck.wait()  # between saves: what stays held, not a copy to the disk still reading a part
        assert _native.held_memory_maps() >= 1
        assert _WhatIHold(tiers[0])[0], "this process holds its parts (else the test proves nothing)"
        loader = torch.utils.data.DataLoader(_WhatIHold(tiers[0]), batch_size=None, num_workers=1,
                                             multiprocessing_context="fork")
        assert list(loader) == [[]]
        ck.save(state(4), 4).wait()  # the registry still serves this process after the fork
        assert ck.store.tiers[0].recycled >= 1


@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
def test_the_copy_to_the_disk_checks_a_part_where_its_save_left_it_and_never_opens_it(tiers, tmp_path, fmt):
    """The copy of a memory-tier part to the disk checks it first (its format, index, records and
    structure) in the mapping its save left held, never through a descriptor of the part: a
    process forked meanwhile (a DataLoader's worker) would inherit that descriptor and keep the
    part's memory as long as it lives. Every open of the part, on any thread, is seen by an audit
    hook (sys.addaudithook: builtins.open and os.open)."""
    with fastckpt.Checkpointer(tiers=tiers, tier_keep=[1, 1], format=fmt) as ck:
        entry, part = _one_part_in_memory(ck)
        held = _native.find_memory_map(part, entry.bytes)
        assert held, "the save left no mapping of its part held (the test would prove nothing)"
        _native.give_back_memory_map(held)
        copy = str(tmp_path / "copy")
        assert _opens_of(part, lambda: tier_copy.copy_part(part, copy, entry)) == []
        with open(part, "rb") as a, open(copy, "rb") as b:
            assert a.read() == b.read()


@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
@pytest.mark.parametrize("where", ["data", "head", "tail"])
def test_a_part_damaged_in_memory_is_named_and_never_copied_to_the_disk(tiers, tmp_path, fmt, where):
    """The check before the copy reads the part where its save left it mapped: a byte flipped in
    the file (the mapping shows it) among the tensor data, in the first bytes (safetensors' header,
    the zip's first record header) or in the last (the zip's directory and comment) is a
    CorruptCheckpointError naming the part, and nothing is written at the copy's path."""
    with fastckpt.Checkpointer(tiers=tiers, tier_keep=[1, 1], format=fmt) as ck:
        entry, part = _one_part_in_memory(ck)
        at = {"data": entry.bytes // 2, "head": 20, "tail": entry.bytes - 30}[where]
        with open(part, "r+b") as f:
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0x5A]))
        copy = tmp_path / "copy"
        with pytest.raises(CorruptCheckpointError, match=re.escape(part)):
            tier_copy.copy_part(part, str(copy), entry)
        assert not copy.exists()


def _one_part_in_memory(ck) -> tuple:
    """(its record's entry, its path) of the part of one checkpoint saved, committed in the
    memory tier and copied to the disk (its mapping left held by the save)."""
    ck.save(state(1), 1).wait()
    ck.wait()
    info = ck.store.tiers[0].committed()[0]
    entry = info.entry_for(0)
    return entry, os.path.join(info.path, entry.name)


_WATCHED: list = []  # (path, the opens of it seen) while _opens_of runs


def _opens_of(path: str, run) -> list:
    """The audited opens (builtins.open, os.open) of path, on any thread, while run() runs."""
    if not getattr(_opens_of, "hooked", False):
        sys.addaudithook(_seen_open)  # for the rest of this process: inert while nothing is watched
        _opens_of.hooked = True
    seen: list = []
    _WATCHED.append((os.path.abspath(path), seen))
    try:
        run()
    finally:
        _WATCHED.remove((os.path.abspath(path), seen))
    return seen


def _seen_open(event: str, args: tuple) -> None:
    if event != "open" or not _WATCHED or not isinstance(args[0], (str, bytes)):
        return
    opened = os.path.abspath(os.fsdecode(args[0]))
    for path, seen in _WATCHED:
        if opened == path:
            seen.append(f"{event} {opened} {args[1:]}")


def test_a_state_loaded_from_memory_never_changes_when_later_saves_recycle_its_file(tiers):
    """load() maps a memory-tier copy (zero-copy views of a private mapping); the saves after it
    remove that checkpoint and recycle part files. The loaded tensors must not see those writes:
    the loaded checkpoint's files are deleted, never written over."""
    with fastckpt.Checkpointer(tiers=tiers, tier_keep=[1, 1]) as ck:
        ck.save(state(1), 1)
    with fastckpt.Checkpointer(tiers=tiers, tier_keep=[1, 1]) as ck:
        loaded = ck.load()
        assert ck.store.reads[-1].tier == os.path.abspath(tiers[0])
        for step in range(2, 6):
            ck.save(state(step), step)
            ck.wait()
        assert ck.store.tiers[0].recycled >= 2  # later parts were recycled: just not the loaded one
        assert_same(state(1), loaded)


def test_a_memory_copy_on_a_read_only_tier_is_loaded_as_a_copy_and_a_save_there_is_a_one_line_error(
        tmp_path, mount_tmpfs):
    """load() maps a memory copy only after marking its folder LENT (so that no later save writes
    over it); where the tier cannot be written (remounted read-only) the copy is read into memory
    instead — still from the memory tier, bit-exact, no file of it mapped — and saving there fails
    with one clear line, nothing lost."""
    place = mount_tmpfs(64 << 20)  # a tmpfs of its own (conftest: skipped where mounting is not allowed)
    tiers = [os.path.join(place, "memory"), str(tmp_path / "disk")]
    with fastckpt.Checkpointer(tiers=tiers) as ck:
        ck.save(state(1), 1)
    subprocess.run(["mount", "-o", "remount,ro", place], check=True)
    with fastckpt.Checkpointer(tiers=tiers) as ck:
        loaded = ck.load()
        assert ck.store.reads[-1].tier == os.path.abspath(tiers[0])
        assert_same(state(1), loaded)
        with open("/proc/self/maps") as maps:
            assert place not in maps.read()  # read as a copy, not mapped
        with pytest.raises(fastckpt.CheckpointWriteError, match="not writable"):
            ck.save(state(2), 2).wait()
    with fastckpt.Checkpointer(tiers[1]) as disk_only:
        assert_same(state(1), disk_only.load())


def test_a_memory_tier_without_room_degrades_to_the_disk_with_one_warning(tiers):
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with fastckpt.Checkpointer(tiers=tiers, tier_keep=[10 ** 9, 2]) as ck:  # room for 10^9 copies: none
            for step in (1, 2):
                ck.save(state(step), step).wait()
            assert ck.store.first == 1 and ck.store.holding() == {2: [tiers[1]], 1: [tiers[1]]}
    about = [w for w in said if "no room" in str(w.message)]
    assert len(about) == 1 and tiers[0] in str(about[0].message)


def test_a_state_that_outgrows_the_memory_tier_later_degrades_to_the_disk_at_that_save(tiers):
    """The first saves fit (an optimizer's state not made yet); a later, 4x larger state would not:
    that save and the next go to the disk, with one warning; nothing fails, everything loads."""
    small, big = state(1), {"w": torch.randn(1024, 1024), "step": 3}
    os.makedirs(tiers[0])
    free = os.statvfs(tiers[0]).f_bavail * os.statvfs(tiers[0]).f_frsize
    keep = free // (2 * small["w"].nbytes)  # the small state needs about half the room, the big one twice it
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with fastckpt.Checkpointer(tiers=tiers, tier_keep=[keep, 5]) as ck:
            for step, s in ((1, small), (2, small)):
                ck.save(s, step).wait()
            assert ck.store.first == 0 and not [w for w in said if "no room" in str(w.message)]
            for step in (3, 4):
                ck.save(big, step).wait()
            assert ck.store.first == 1 and ck.store.holding()[4] == [tiers[1]]
            assert_same(big, ck.load())
    about = [w for w in said if "no room" in str(w.message)]
    assert len(about) == 1 and tiers[0] in str(about[0].message)


@pytest.mark.parametrize("settings, says", [
    ({"tiers": ["/dev/shm/x"]}, "two or more paths"),
    ({"tiers": ["/dev/shm/x", "/dev/shm/x/y"]}, "separate places"),
    ({"tiers": ["/dev/shm/x", "/d"], "root": "/e"}, "root is the last tier"),
    ({"tiers": ["/dev/shm/x", "/d"], "store": "path"}, "one place, the memory tier"),
    ({"tiers": ["/dev/shm/x", "/d"], "store": "pmem", "root": "/dev/shm/p.pool"}, "store='root'"),
    ({"tiers": ["/dev/shm/x", "/d"], "tier_keep": [0, 1]}, "tier_keep"),
    ({"tiers": ["/dev/shm/x", "/d"], "tier_keep": [1]}, r"tier_keep must give each of the 2 tiers one value .*1 value"),
    ({"tiers": ["/dev/shm/x", "/d", "/e"], "tier_keep": [1, 2]}, "each of the 3 tiers one value"),
    ({"tiers": ["/dev/shm/x", "/d"], "tier_keep": [1, 2, 3]}, "each of the 2 tiers one value .*3 values"),
    ({"tiers": ["/dev/shm/x", "/d"], "tier_keep": 2}, "each of the 2 tiers one value .*no list"),
    ({"tier_keep": [1, 2]}, "tier_keep needs tiers"),
    ({"replicas": 1}, "replicas needs tiers"),
    ({"tiers": ["/dev/shm/x", "/d"], "replicas": 2}, "replicas must be 0 or 1"),
    ({"tiers": ["/dev/shm/x", "/d"], "persist_every": 0}, "persist_every must be an integer >= 1"),
    ({"tiers": ["/dev/shm/x", "/d"], "persist_every": True}, "persist_every must be an integer >= 1"),
    ({"persist_every": 2}, "persist_every needs tiers"),
    ({"tiers": ["/dev/shm/x"], "store": "path", "persist_every": 2}, "always persisted to its path"),
    ({"preempt_signal": "SIGNOPE"}, "preempt_signal must be a signal"),
    ({"preempt_signal": 9}, "not a signal a handler can catch"),
    ({"preempt_grace_s": 0}, "preempt_grace_s"),
])
def test_bad_tier_settings_are_one_line_errors(settings, says):
    with pytest.raises(ConfigError, match=says) as got:
        fastckpt.Checkpointer(**settings)
    assert "\n" not in str(got.value)


def _hydra(tiers, keep):
    from hydra import compose, initialize_config_dir

    from fastckpt.config.hydra import instantiate
    from support.paths import CONFIGS
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config", overrides=[f"tiers=[{','.join(tiers)}]",
                                                       f"tier_keep=[{','.join(map(str, keep))}]"])
    return instantiate(cfg)


def _deepspeed_entry(memory, keep):
    pytest.importorskip("deepspeed")
    from deepspeed_fastckpt.settings import checkpointer_config
    return checkpointer_config({"tiers": [memory], "tier_keep": keep})


def _torchtitan(memory, keep):
    pytest.importorskip("torchtitan")
    from torchtitan_fastckpt import CheckpointManager
    return CheckpointManager.Config(tiers=[memory], tier_keep=keep)


def _lightning(memory, keep):
    from lightning_fastckpt import FastCheckpointIO
    return FastCheckpointIO(tiers=[memory], tier_keep=keep)


def _dcp(memory, keep):
    from fastckpt.dcp import FastStorageWriter
    return FastStorageWriter(os.path.join(os.path.dirname(memory), "dcp"), tiers=[memory], tier_keep=keep)


# (front end, whether it takes every tier (store 'root') or the one memory tier in front of named paths)
FRONT_ENDS = {
    "Checkpointer": (lambda tiers, keep: fastckpt.Checkpointer(tiers=tiers, tier_keep=keep), True),
    "settings": (lambda tiers, keep: fastckpt.Checkpointer(settings=CheckpointerConfig(tiers=tiers, tier_keep=keep)),
                 True),
    "hydra": (_hydra, True),
    "NamedCheckpoints": (lambda memory, keep: NamedCheckpoints.by_path({"tiers": [memory], "tier_keep": keep}), False),
    "FastCheckpointIO": (_lightning, False),
    "deepspeed": (_deepspeed_entry, False),
    "FastStorageWriter": (_dcp, False),
    "torchtitan": (_torchtitan, False),
}


@pytest.mark.parametrize("front_end", list(FRONT_ENDS))
def test_a_per_tier_list_of_the_wrong_length_is_refused_by_every_front_end_before_anything_is_written(
        tmp_path, front_end):
    """tier_keep gives one count per tier (store 'root': every tier; in front of named paths: the
    one memory tier). Every front end builds its settings through the one check, so a list one
    too short or one too long is a one-line ConfigError when the settings are made — not an
    IndexError on a commit thread after the first persist, nor a tier keeping another's count —
    and nothing is created on disk."""
    make, every_tier = FRONT_ENDS[front_end]
    tiers = [str(tmp_path / "memory"), str(tmp_path / "disk")]
    places, wrong = (tiers, ([2], [2, 2, 2])) if every_tier else (tiers[0], ([], [2, 2]))
    for keep in wrong:
        with pytest.raises(ConfigError, match=r"tier_keep must give .* one value \(\d in all\)") as got:
            make(places, keep)
        assert "\n" not in str(got.value)
    assert os.listdir(tmp_path) == []


def test_the_root_is_the_last_tier():
    cfg = CheckpointerConfig(tiers=["/dev/shm/x", "/ssd/run"])
    assert cfg.root == "/ssd/run" and cfg.tiers == ("/dev/shm/x", "/ssd/run") and cfg.keep_on_tiers() == (1, 2)
