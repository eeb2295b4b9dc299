"""The store protocol's conformance suite (fastckpt/store/protocol.py): the same cases over every
store — root; path with a local path and with an fsspec memory:// URL; pmem (a pool on /dev/shm);
tiers (a memory tier on /dev/shm in front of a root); named tiers (one in front of local paths);
s3 (a prefix of a bucket on a real S3 server, SeaweedFS on loopback: a crash image is every object
complete at that moment, copied by the server; an unfinished multipart upload is in none); tiers
to s3 (a memory tier on /dev/shm in front of such a prefix, drained to it) —
each driven by a real Checkpointer:

  commit order   a checkpoint is in no crash image before its data is durable: an image of the
                 place taken while its write is held just before it is known durable holds the
                 previous checkpoint, whole, and nothing damaged;
  in order       checkpoints issued one after another commit in that order, whichever finishes
                 first (the same name saved three times holds the third);
  listing        every committed checkpoint is there, newest first, with its size;
  retention      a removal while a checkpoint is in flight never touches it, and the newest
                 committed one stays loadable throughout;
  bad input      a save that names a path where the store names its own (or none where it
                 needs one) is refused; a damaged checkpoint is never loaded.

A deliberately broken store — the root store writing its record when a checkpoint begins, before
any data — fails the first case (test_a_store_that_records_first_fails_the_suite).
"""
from __future__ import annotations

import abc
import contextlib
import os
import shutil
import threading
import uuid

import pytest
import torch

from fastckpt import Checkpointer
from fastckpt.commit import record as commit
from fastckpt.errors import CorruptCheckpointError, NoCheckpointError
from fastckpt.store.named_tiers import TARGET
from fastckpt.store.root_store import RootStore

HOLD_S = 60


def state(step: int) -> dict:
    return {"step": step, "w": torch.arange(20000, dtype=torch.float32) + step}


class Place(abc.ABC):
    """One store under test: its Checkpointer, where saves go, what a reader sees, a crash image."""

    by_path = False

    def __init__(self, where: str):
        self.where = where

    @abc.abstractmethod
    def checkpointer(self, **kw) -> Checkpointer:
        """A Checkpointer over this place."""

    def target(self, name: str = "last"):
        return None

    def save(self, ck: Checkpointer, step: int, name: str = "last"):
        return ck.save(state(step), step=step, path=self.target(name))

    def newest(self, ck: Checkpointer, name: str = "last") -> int:
        """The step a reader gets back from what is committed (verified)."""
        if self.by_path:
            return ck.store.load_path(self.target(name), 0)["step"]
        return ck.load()["step"]

    def listed(self, ck: Checkpointer, names: list[str]) -> list[tuple[int, int]]:
        """(step, bytes) of every committed checkpoint, newest first."""
        if self.by_path:
            rows = [(ck.store.load_path(self.target(n), 0)["step"], ck.store.size_of(self.target(n))) for n in names]
            return sorted(rows, reverse=True)
        return [(c.step, c.bytes) for c in ck.store.committed()]

    def committed(self, ck: Checkpointer, name: str = "last") -> tuple[list[int], list[str]]:
        """(the steps the store lists as committed, newest first; why it passed others over),
        nothing loaded: a checkpoint must never be listed before its data is durable."""
        if self.by_path:
            size = ck.store.size_of(self.target(name))
            return ([ck.store.load_path(self.target(name), 0, verify=False)["step"]] if size else []), []
        found: list[str] = []
        return [c.step for c in ck.store.committed(found)], found

    @abc.abstractmethod
    def image(self) -> "Place":
        """What is on the media now, copied to a new place of the same kind."""

    def remove_older(self, ck: Checkpointer, names: list[str]) -> None:
        """Removes committed checkpoints other than the newest, while one may be in flight."""
        if self.by_path:
            for n in names:
                ck.store.remove_path(self.target(n))
        else:
            ck.store.retain(1, ck._inflight.directories())

    @abc.abstractmethod
    def damage(self, ck: Checkpointer, name: str = "last") -> None:
        """One byte of the committed checkpoint's data flipped."""

    def cleanup(self) -> None:
        pass


class Root(Place):
    def checkpointer(self, **kw):
        return Checkpointer(self.where, **kw)

    def image(self):
        copy = f"{self.where}-image-{uuid.uuid4().hex[:6]}"
        shutil.copytree(self.where, copy)
        return type(self)(copy)

    def damage(self, ck, name="last"):
        info = ck.store.committed()[0]
        _flip(info.file_for(0))


class LocalPath(Place):
    by_path = True

    def checkpointer(self, **kw):
        os.makedirs(self.where, exist_ok=True)
        return Checkpointer(store="path", **kw)

    def target(self, name="last"):
        return os.path.join(self.where, f"{name}.ckpt")

    def image(self):
        copy = f"{self.where}-image-{uuid.uuid4().hex[:6]}"
        shutil.copytree(self.where, copy)
        return type(self)(copy)

    def damage(self, ck, name="last"):
        _flip(self.target(name))


class WithMemoryTier:
    """A place with a memory tier on /dev/shm in front of it: both copied into an image."""

    def __init__(self, where: str, memory: str):
        super().__init__(where)
        self.memory = memory

    def image(self):
        tag = uuid.uuid4().hex[:6]
        copy = type(self)(f"{self.where}-image-{tag}", f"{self.memory}-image-{tag}")
        for src, dst in ((self.where, copy.where), (self.memory, copy.memory)):
            if os.path.exists(src):
                shutil.copytree(src, dst)
        return copy

    def cleanup(self):
        shutil.rmtree(self.memory, ignore_errors=True)


class NamedTiersPlace(WithMemoryTier, LocalPath):
    """A memory tier on /dev/shm in front of local paths (store 'path' with `tiers`)."""

    def checkpointer(self, **kw):
        os.makedirs(self.where, exist_ok=True)
        keep = {"tier_keep": (4,)} if kw.get("keep") == 0 else {}
        return Checkpointer(store="path", tiers=[self.memory], **keep, **kw)

    def image(self):
        copy = super().image()
        # each memory copy names the path it is a copy of: the image's copies name the image's paths
        # (a crash leaves both where they were)
        _retarget(copy.memory, os.path.abspath(self.where), os.path.abspath(copy.where))
        return copy

    def damage(self, ck, name="last"):
        ck.wait()  # persisted to the path too: every copy is damaged
        for _, file in ck.store.copies_of(self.target(name)):
            _flip(file)
        _flip(self.target(name))


class MemoryUrl(LocalPath):
    def __init__(self, where: str):
        super().__init__(where)
        self.fs = pytest.importorskip("fsspec").filesystem("memory")

    def checkpointer(self, **kw):
        return Checkpointer(store="path", **kw)

    def target(self, name="last"):
        return f"{self.where}/{name}.ckpt"

    def image(self):
        copy = type(self)(f"{self.where}-image-{uuid.uuid4().hex[:6]}")
        for path in self.fs.find(self.where):
            self.fs.pipe_file("memory://" + path.replace(self.where[len("memory://"):], copy.where[len("memory://"):], 1),
                              self.fs.cat_file(path))
        return copy

    def damage(self, ck, name="last"):
        data = bytearray(self.fs.cat_file(self.target(name)))
        data[len(data) // 2] ^= 0xFF
        self.fs.pipe_file(self.target(name), bytes(data))

    def cleanup(self):
        for path in self.fs.ls("/", detail=False):
            if path.lstrip("/").startswith(self.where[len("memory://"):].lstrip("/").split("/")[0]):
                self.fs.rm(path, recursive=True)


class Pool(Place):
    def checkpointer(self, **kw):
        return Checkpointer(self.where, store="pmem", pool_mb=32, **kw)

    def image(self):
        copy = f"{self.where}-image-{uuid.uuid4().hex[:6]}"
        shutil.copyfile(self.where, copy)
        return type(self)(copy)

    def damage(self, ck, name="last"):
        pool = ck.store.pool
        current = [v for v in pool.versions("default") if v.active][0]
        pool.view[current.desc.data_off + 100] ^= 0xFF


class Tiers(WithMemoryTier, Place):
    """A memory tier on /dev/shm in front of a root on disk (settings `tiers`)."""

    def checkpointer(self, **kw):
        # keep=0 (all kept): the memory tier keeps the suite's few saves too, not its newest alone
        keep = {"tier_keep": (4, 0)} if kw.get("keep") == 0 else {}
        return Checkpointer(tiers=[self.memory, self.where], **keep, **kw)

    def damage(self, ck, name="last"):
        ck.wait()  # persisted behind the memory tier too: every copy is damaged
        step = ck.store.committed()[0].counter
        for tier in ck.store.tiers:
            for info in tier.committed():
                if info.counter == step:
                    _flip(info.file_for(0))


class Bucket(Place):
    """A prefix of the test server's bucket (store 's3', root='s3://ckpt/...')."""

    def __init__(self, where: str, server):
        super().__init__(where)
        self.server = server

    def checkpointer(self, **kw):
        return Checkpointer(self.where, **kw)

    def _keys(self) -> list[str]:
        import obstore
        prefix = self.where.split("/", 3)[3] + "/"
        return [o["path"] for o in obstore.list(self.server.store(), prefix=prefix).collect()]

    def image(self):
        import obstore
        copy = self._like(f"{self.where}-image-{uuid.uuid4().hex[:6]}")
        old, new = self.where.split("/", 3)[3], copy.where.split("/", 3)[3]
        for key in self._keys():
            obstore.copy(self.server.store(), key, new + key[len(old):])
        return copy

    def _like(self, where: str) -> "Bucket":
        """A place of this kind at where (an image's)."""
        return Bucket(where, self.server)

    def damage(self, ck, name="last"):
        import obstore
        store = ck.store.tiers[-1] if hasattr(ck.store, "tiers") else ck.store
        info = store.committed()[0]
        key = store.where.key_of(info.file_for(0))
        data = bytearray(obstore.get(self.server.store(), key).bytes())
        data[len(data) // 2] ^= 0xFF
        obstore.put(self.server.store(), key, bytes(data))

    def cleanup(self):
        import obstore
        keys = self._keys()
        if keys:
            obstore.delete(self.server.store(), keys)


class TiersToBucket(Bucket):
    """A memory tier on /dev/shm in front of a prefix of the test server's bucket (tiers=[memory, 's3://...'])."""

    def __init__(self, where: str, server, memory: str):
        super().__init__(where, server)
        self.memory = memory

    def checkpointer(self, **kw):
        keep = {"tier_keep": (4, 0)} if kw.get("keep") == 0 else {}
        return Checkpointer(tiers=[self.memory, self.where], **keep, **kw)

    def _like(self, where: str) -> "TiersToBucket":
        """A place of this kind at where, with a memory tier of its own (an image's)."""
        return TiersToBucket(where, self.server, f"{self.memory}-image-{uuid.uuid4().hex[:6]}")

    def image(self):
        copy = super().image()
        if os.path.exists(self.memory):
            shutil.copytree(self.memory, copy.memory)
        return copy

    def damage(self, ck, name="last"):
        ck.wait()  # drained to the bucket too: every copy is damaged
        counter = ck.store.committed()[0].counter
        for info in ck.store.tiers[0].committed():
            if info.counter == counter:
                _flip(info.file_for(0))
        super().damage(ck, name)

    def cleanup(self):
        super().cleanup()
        shutil.rmtree(self.memory, ignore_errors=True)


class NamedTiersToBucket(Bucket):
    """A memory tier on /dev/shm in front of s3:// paths (store 'path' with `tiers`: Lightning's
    `.ckpt` in a bucket behind FastCheckpointIO(tiers=[memory]))."""

    by_path = True

    def __init__(self, where: str, server, memory: str):
        super().__init__(where, server)
        self.memory = memory

    def checkpointer(self, **kw):
        keep = {"tier_keep": (4,)} if kw.get("keep") == 0 else {}
        return Checkpointer(store="path", tiers=[self.memory], **keep, **kw)

    def target(self, name="last"):
        return f"{self.where}/{name}.ckpt"

    def _like(self, where: str) -> "NamedTiersToBucket":
        return NamedTiersToBucket(where, self.server, f"{self.memory}-image-{uuid.uuid4().hex[:6]}")

    def image(self):
        copy = super().image()
        if os.path.exists(self.memory):
            shutil.copytree(self.memory, copy.memory)
        _retarget(copy.memory, self.where + "/", copy.where + "/")  # the image's copies name the image's paths
        return copy

    def damage(self, ck, name="last"):
        import obstore
        ck.wait()  # persisted to the path too: every copy is damaged
        for _, file in ck.store.copies_of(self.target(name)):
            _flip(file)
        key = self.target(name).split("/", 3)[3]
        data = bytearray(obstore.get(self.server.store(), key).bytes())
        data[len(data) // 2] ^= 0xFF
        obstore.put(self.server.store(), key, bytes(data))

    def cleanup(self):
        super().cleanup()
        shutil.rmtree(self.memory, ignore_errors=True)


def _retarget(memory: str, old: str, new: str) -> None:
    """Each memory copy under memory names the path it is a copy of: old's place becomes new's."""
    for folder, _, files in os.walk(memory):
        if TARGET in files:
            with open(os.path.join(folder, TARGET), "r+", encoding="utf-8") as f:
                named = f.read().replace(old, new, 1)
                f.seek(0), f.truncate(), f.write(named)


def _flip(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.fixture(params=["root", "path", "url", "pmem", "tiers", "named-tiers", "s3", "tiers-s3", "named-tiers-s3"])
def place(request, tmp_path, shm):
    if request.param in ("s3", "tiers-s3", "named-tiers-s3"):
        server = request.getfixturevalue("s3_env")
        url = f"s3://{server.bucket}/suite-{uuid.uuid4().hex[:8]}"
        memory = os.path.join(shm, f"memory-tier-{uuid.uuid4().hex[:6]}")
        made = {"s3": lambda: Bucket(url, server), "tiers-s3": lambda: TiersToBucket(url, server, memory),
                "named-tiers-s3": lambda: NamedTiersToBucket(url, server, memory)}[request.param]()
        yield made
        made.cleanup()
        return
    made = {"root": lambda: Root(str(tmp_path / "root")), "path": lambda: LocalPath(str(tmp_path / "ckpts")),
            "named-tiers": lambda: NamedTiersPlace(str(tmp_path / "ckpts"), os.path.join(shm, "memory-tier")),
            "tiers": lambda: Tiers(str(tmp_path / "disk"), os.path.join(shm, "memory-tier")),
            "url": lambda: MemoryUrl(f"memory://store-suite-{uuid.uuid4().hex[:8]}"),
            "pmem": lambda: Pool(os.path.join(shm, "suite.pool"))}[request.param]()
    yield made
    made.cleanup()


class Hold:
    """Holds chosen checkpoints' writes just before they are known durable (inside write.finish,
    on their commit thread); what is on the media then is a crash image of that moment."""

    def __init__(self, ck: Checkpointer, steps: set[int]):
        self.steps, self.held, self.release = steps, threading.Event(), threading.Event()
        self.log: list[tuple[str, int]] = []
        store = ck.store
        finish_write, commit_file = store.finish_write, store.commit_file
        by_part: dict[str, int] = {}
        begin = store.begin

        def begin_(step, counter, rank, fmt, target=None, plan=None, meta=None):
            ckpt_id, part = begin(step, counter, rank, fmt, target, plan=plan, meta=meta)
            by_part[part] = step
            return ckpt_id, part

        def finish_write_(write, part):
            if by_part.get(part) in self.steps:
                real = write.finish

                def finish():
                    self.held.set()
                    assert self.release.wait(HOLD_S), "never released"
                    return real()
                write.finish = finish
            return finish_write(write, part)

        def commit_file_(ckpt_id, part, result):
            self.log.append(("commit_file", by_part.get(part)))
            return commit_file(ckpt_id, part, result)

        store.begin, store.finish_write, store.commit_file = begin_, finish_write_, commit_file_

    def wait_held(self) -> None:
        assert self.held.wait(HOLD_S), "the held write never reached its finish"


@contextlib.contextmanager
def holding(place: Place, steps: set[int], **settings):
    """A Checkpointer of the place whose saves of these steps are held (Hold); on the way out
    they are let go and it closes."""
    ck = place.checkpointer(**settings)
    hold = Hold(ck, steps)
    try:
        yield ck, hold
    finally:
        hold.release.set()
        ck.close()


# -- the cases ---------------------------------------------------------------
def check_no_record_before_durable(place: Place) -> None:
    with holding(place, {2}, concurrency=2, keep=0) as (ck, hold):
        first = place.save(ck, 1)
        first.wait()
        assert first.wait_placed(60)  # behind a memory tier, persisted too: the image is never of its copy half-way
        pending = place.save(ck, 2)
        hold.wait_held()
        image = place.image()
        reader = image.checkpointer(concurrency=2, keep=0)
        try:
            steps, problems = image.committed(reader)
            assert steps[:1] == [1], f"a checkpoint whose data was not yet durable is in the crash image: {steps}"
            assert problems == [], f"the crash image holds a damaged record: {problems}"
            assert image.newest(reader) == 1
        finally:
            reader.close()
            image.cleanup()
        hold.release.set()
        pending.wait()
        assert place.newest(ck) == 2


def test_a_checkpoint_is_in_no_crash_image_before_its_data_is_durable(place):
    check_no_record_before_durable(place)


def test_checkpoints_commit_in_the_order_they_were_issued(place):
    with holding(place, {1}, concurrency=3, keep=0) as (ck, hold):
        first = place.save(ck, 1)
        hold.wait_held()
        later = [place.save(ck, s) for s in (2, 3)]
        assert not first.done() and not any(p.done() for p in later)  # nothing lands before the first
        hold.release.set()
        for p in [first, *later]:
            p.wait()
        assert [s for what, s in hold.log if what == "commit_file"] == [1, 2, 3]
        assert place.newest(ck) == 3  # the same name saved three times holds the third


def test_every_committed_checkpoint_is_listed_newest_first_with_its_size(place):
    ck = place.checkpointer(concurrency=2, keep=0)
    try:
        infos = [place.save(ck, s, name=f"s{s}").wait() for s in (1, 2, 3)]
        listed = place.listed(ck, [f"s{s}" for s in (1, 2, 3)])
        assert listed == [(s, info.bytes) for s, info in zip((3, 2, 1), reversed(infos))]
    finally:
        ck.close()


def test_a_removal_while_a_checkpoint_is_in_flight_never_touches_it(place):
    with holding(place, {3}, concurrency=2, keep=1) as (ck, hold):
        place.save(ck, 1, name="s1").wait()
        place.save(ck, 2, name="s2").wait()
        pending = place.save(ck, 3, name="s3")
        hold.wait_held()
        place.remove_older(ck, ["s1"])
        assert place.newest(ck, name="s2") == 2  # the newest committed one stays loadable
        hold.release.set()
        pending.wait()
        assert place.newest(ck, name="s3") == 3


def test_bad_input_is_refused_and_a_damaged_checkpoint_never_loads(place):
    ck = place.checkpointer(concurrency=1, keep=0)
    try:
        wrong = None if place.by_path else os.path.join(os.path.dirname(place.where), "x.ckpt")
        with pytest.raises(ValueError, match="path="):
            ck.save(state(1), step=1, path=wrong)
        place.save(ck, 1).wait()
        place.damage(ck)
        with pytest.raises((CorruptCheckpointError, NoCheckpointError)):
            place.newest(ck)
    finally:
        ck.close()


# -- a broken store fails it ---------------------------------------------------
class RecordsFirst(RootStore):
    """Broken on purpose: writes a checkpoint's record when it begins, before any of its data."""

    def begin(self, step, counter, rank, fmt, target=None, plan=None, meta=None):
        ckpt_dir, part = super().begin(step, counter, rank, fmt, target, plan=plan, meta=meta)
        entry = commit.FileEntry(os.path.basename(part), rank, plan.file_size, 0)
        commit.write(commit.CommitInfo(step=step, path=ckpt_dir, bytes=plan.file_size, counter=counter, time=0.0,
                                       world_size=1, format=fmt, files=(entry,)))
        return ckpt_dir, part


class BrokenRoot(Root):
    def checkpointer(self, **kw):
        ck = Checkpointer(self.where, **kw)
        ck.store.__class__ = RecordsFirst
        return ck

    def image(self):
        copy = super().image()
        return Root(copy.where)


def test_a_store_that_records_first_fails_the_suite(tmp_path):
    with pytest.raises(AssertionError, match="crash image"):
        check_no_record_before_durable(BrokenRoot(str(tmp_path / "root")))
