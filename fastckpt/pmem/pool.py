"""A pool of many models' checkpoints in one mapped file or DAX device (Portus §III-D, §IV).

Owns opening/creating the pool (native mapping, persistence mode), the model table
(create, find, drop), each model's version slots (claim an inactive one, seal it, flip
the active word), space (first-fit extents in the heap, computed from the descriptors
themselves, so there is no allocator state to tear), reading a version's bytes back,
and repack. Every change to the table runs under one lock: a thread lock plus flock()
on the pool, so several processes may share a pool.

Crash safety: a version's data and metadata are persisted before its slot is sealed,
and the slot is sealed before the active word flips to it; the previous version's slot
is never the one being written. After a crash at any point the pool opens with each
model's active version, or, should that fail to verify, its newest older sealed one.
A new pool is whole on disk before anything is saved into it: sized, its superblock
persisted, the file fsync'ed and its name made durable (its directory fsync'ed). A file
a crash left while the pool was being created — empty, or its first page still blank —
holds no checkpoint: readers find none (is_blank), and the next save makes the pool anew.
"""
from __future__ import annotations

import fcntl
import os
import stat
import threading
from contextlib import contextmanager
from dataclasses import dataclass

from .. import _native
from ..errors import CheckpointWriteError, ConfigError, CorruptCheckpointError
from ..fsutil import fsync_dir
from . import claims
from . import layout as L

PERSIST = ("auto", "fence", "msync")


@dataclass
class Version:
    """A sealed version of a model: where it is and what it says of itself."""

    model: str
    entry: int
    slot: int
    desc: L.Slot
    active: bool

    @property
    def counter(self) -> int:
        return self.desc.counter

    @property
    def step(self) -> int:
        return self.desc.step

    @property
    def nbytes(self) -> int:
        return self.desc.meta_len + self.desc.data_len


def is_blank(path: str) -> bool:
    """A regular file that is empty or whose first page is all zeros: a pool whose creation a
    crash cut short (its superblock never reached the disk), which holds nothing."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return False
        with open(path, "rb") as f:
            return not any(f.read(4096))
    except OSError:
        return False


def check_device_path(path: str) -> None:
    """A pool named directly under /dev must be an existing DAX character device: creating a
    regular file there (a typo, a machine without the device) is never what was meant."""
    if os.path.dirname(os.path.abspath(path)) != "/dev":
        return
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(f"{path} is not a DAX device: there is no such device on this machine (a pool on "
                          "/dev must be an existing /dev/daxN.M; a pool file goes on a filesystem, e.g. "
                          "/dev/shm/NAME.pool)") from None
    subsystem = f"/sys/dev/char/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}/subsystem"
    if not stat.S_ISCHR(st.st_mode) or os.path.basename(os.path.realpath(subsystem)) != "dax":
        raise ConfigError(f"{path} is not a DAX device; a pool on /dev must be an existing /dev/daxN.M")


class Pool:
    """An open pool. Pool(path, size_mb=...) creates it when missing; persist picks the path."""

    def __init__(self, path, size_mb: int | None = None, persist: str = "auto", create: bool = True):
        if persist not in PERSIST:
            raise ConfigError(f"unknown persist {persist!r}; choose one of: {', '.join(PERSIST)}")
        self.path = os.path.abspath(os.fspath(path))
        force = {"auto": -1, "fence": 0, "msync": 1}[persist]
        env = os.environ.get("FASTCKPT_PMEM_PERSIST")
        if persist == "auto" and env in ("fence", "msync"):
            force = {"fence": 0, "msync": 1}[env]
        check_device_path(self.path)
        if not create and not os.path.exists(self.path):
            raise FileNotFoundError(f"no pool at {self.path!r}")
        parent = os.path.dirname(self.path)
        if not os.path.isdir(parent):
            raise FileNotFoundError(f"cannot create pool {self.path!r}: directory {parent!r} does not exist")
        self._lock = threading.RLock()
        self._claimed: dict[tuple[int, int], int] = {}  # (model, slot) -> fd holding its writer's lock
        self._lock_fd = os.open(self.path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
        try:
            with self._flock():  # whoever creates the pool does it whole before anyone maps it
                st = os.fstat(self._lock_fd)
                fresh = stat.S_ISREG(st.st_mode) and (st.st_size == 0 or is_blank(self.path))
                size = 0
                if fresh and not create:
                    raise CorruptCheckpointError(f"{self.path} is an empty or blank file, not a fastckpt pool")
                if fresh:  # new, or a creation a crash cut short: made anew, whole
                    size = (size_mb or 0) << 20
                    if size < L.MIN_POOL:
                        raise ConfigError(f"a new pool needs pool_mb >= {L.MIN_POOL >> 20} (got {size_mb!r})")
                    os.ftruncate(self._lock_fd, 0)
                self.native = _native.PmemPool(self.path, size, fresh, force)
                self.view = memoryview(self.native)
                if not any(self.view[:4096]):  # a device-dax device never written
                    if not create:
                        raise CorruptCheckpointError(f"{self.path} is not a fastckpt pool (it is blank)")
                    self.native.write(0, L.encode_super(self.native.size))
                if fresh:  # its size and its name durable before anything is saved into it
                    os.fsync(self._lock_fd)
                    fsync_dir(parent)
                try:
                    L.decode_super(bytes(self.view[:64]))
                except ValueError as e:
                    raise CorruptCheckpointError(f"{self.path}: {e}") from None
        except BaseException:
            os.close(self._lock_fd)
            raise
        self.size = self.native.size

    # -- locking -----------------------------------------------------------
    @contextmanager
    def _flock(self):
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    @contextmanager
    def locked(self):
        """Exclusive use of the table, against threads and other processes."""
        with self._lock, self._flock():
            yield

    def close(self) -> None:
        for fd in self._claimed.values():
            claims.let_go(fd)
        self._claimed.clear()
        if self._lock_fd >= 0:
            self.view.release()
            self.native = None
            os.close(self._lock_fd)
            self._lock_fd = -1

    # -- facts -------------------------------------------------------------
    @property
    def persist_name(self) -> str:
        return self.native.persist_name

    def describe(self) -> dict:
        return {"path": self.path, "size": self.size, "persist": self.native.persist_name,
                "map_sync": self.native.map_sync, "device_dax": self.native.device_dax}

    # -- the model table ---------------------------------------------------
    def _entry_name(self, i: int) -> str | None:
        off = L.entry_off(i)
        if self.native.load8(off) != L.USED:
            return None
        return L.decode_name(bytes(self.view[off + 16:off + 24 + L.NAME_MAX]))

    def models(self) -> dict[str, int]:
        """Model name -> table index, for every model in the pool."""
        out = {}
        for i in range(L.MAX_MODELS):
            name = self._entry_name(i)
            if name is not None:
                out.setdefault(name, i)
        return out

    def find(self, name: str) -> int | None:
        return self.models().get(name)

    def ensure_model(self, name: str) -> int:
        """The table index of `name`, creating an empty entry for it (under the lock)."""
        raw = L.encode_name(name)
        with self.locked():
            found = self.find(name)
            if found is not None:
                return found
            for i in range(L.MAX_MODELS):
                off = L.entry_off(i)
                if self.native.load8(off) != L.USED:
                    self.native.store8(off + 8, 0)
                    blank = bytes(L.SLOT_BYTES * L.SLOTS)
                    self.native.write(off + L.SLOTS_OFF, blank)
                    self.native.write(off + 16, raw)
                    self.native.store8(off, L.USED)  # last: the entry exists, empty
                    return i
        raise CheckpointWriteError(f"pool {self.path} already holds {L.MAX_MODELS} models; "
                                   "drop some (fastckpt repack --drop) or use another pool")

    def drop(self, name: str) -> bool:
        """Removes a model and every version of it; its space is free at once."""
        with self.locked():
            i = self.find(name)
            if i is None:
                return False
            self.native.store8(L.entry_off(i), 0)
            return True

    # -- slots ---------------------------------------------------------------
    def slot(self, i: int, s: int) -> tuple[L.Slot, bool]:
        off = L.slot_off(i, s)
        return L.Slot.decode(bytes(self.view[off:off + L.SLOT_BYTES]))

    def active(self, i: int) -> tuple[int, int] | None:
        return L.unpack_active(self.native.load8(L.entry_off(i) + 8))

    def versions(self, name: str) -> list[Version]:
        """Sealed versions of a model, newest counter first (the active one flagged)."""
        i = self.find(name)
        if i is None:
            return []
        act = self.active(i)
        out = []
        for s in range(L.SLOTS):
            desc, sealed = self.slot(i, s)
            if sealed:
                out.append(Version(name, i, s, desc, act == (desc.counter, s)))
        return sorted(out, key=lambda v: -v.counter)

    def loadable(self, name: str) -> list[Version]:
        """What a reader may load of a model, best first: its current version, then older sealed
        ones. A sealed version newer than the active word was never committed and is left out."""
        i = self.find(name)
        act = self.active(i) if i is not None else None
        if act is None:
            return []
        return sorted((v for v in self.versions(name) if v.counter <= act[0]), key=lambda v: (not v.active, -v.counter))

    def top_counter(self, name: str) -> int:
        """The highest counter a model has used (sealed slot or active word); 0 for none."""
        i = self.find(name)
        act = self.active(i) if i is not None else None
        return max([act[0] if act else 0] + [v.counter for v in self.versions(name)])

    def _fit_pair(self, used: list[tuple[int, int]], meta_cap: int, data_cap: int) -> tuple[int, int] | None:
        """First-fit room for a version's metadata extent and then its data extent."""
        m = self._first_fit(used, meta_cap)
        d = self._first_fit(sorted(used + [(m, meta_cap)]), data_cap) if m is not None else None
        return None if d is None else (m, d)

    def _used_extents(self, skip: tuple[int, int] | None = None) -> list[tuple[int, int]]:
        ext = []
        for i in range(L.MAX_MODELS):
            if self.native.load8(L.entry_off(i)) != L.USED:
                continue
            for s in range(L.SLOTS):
                if (i, s) != skip:
                    ext.extend(self.slot(i, s)[0].extents())
        return sorted(ext)

    def _first_fit(self, used: list[tuple[int, int]], need: int) -> int | None:
        cursor = L.HEAP_OFF
        for off, cap in used:
            if off - cursor >= need:
                return cursor
            cursor = max(cursor, off + cap)
        return cursor if self.size - cursor >= need else None

    def free_bytes(self) -> int:
        used = self._used_extents()
        return self.size - L.HEAP_OFF - sum(c for _, c in used)

    def claim(self, i: int, slots: int, busy: set[int], meta_bytes: int, data_bytes: int) -> tuple[int, L.Slot]:
        """Picks the slot a new version of model i is written into, invalidates it and gives it
        room: never the active slot nor one in `busy`; among slots [0, slots), the empty or
        oldest. Its extents are reused when they fit, otherwise first-fit ones are found."""
        meta_cap, data_cap = L.round_up(max(meta_bytes, 1)), L.round_up(max(data_bytes, 1))
        with self.locked():
            act = self.active(i)
            choices = []
            for s in range(slots):
                if s in busy or (act is not None and act[1] == s):
                    continue
                desc, sealed = self.slot(i, s)
                choices.append((desc.counter if sealed else 0, s, desc))
            if not choices:
                raise CheckpointWriteError(f"model {self._entry_name(i)!r} in pool {self.path} has no free "
                                           f"slot ({slots} slots, {len(busy)} versions in flight)")
            _, s, desc = min(choices)
            off = L.slot_off(i, s)
            if desc.meta_cap < meta_cap or desc.data_cap < data_cap:
                used = self._used_extents(skip=(i, s))  # the victim's own room counts as free
                room = self._fit_pair(used, meta_cap, data_cap)
                if room is None:  # nothing was touched: the victim's version stays valid
                    free = self.size - L.HEAP_OFF - sum(c for _, c in used)
                    raise CheckpointWriteError(
                        f"pool {self.path} is full: a version of {meta_cap + data_cap} bytes does not fit "
                        f"({free} bytes free, in gaps); run `fastckpt repack {self.path}`, drop models, "
                        "or create a larger pool")
                desc = L.Slot(meta_off=room[0], meta_cap=meta_cap, data_off=room[1], data_cap=data_cap)
            else:
                desc = L.Slot(meta_off=desc.meta_off, meta_cap=desc.meta_cap, data_off=desc.data_off,
                              data_cap=desc.data_cap)
            self.unclaim(i, s)  # an earlier write of ours into this slot gave up
            fd = claims.hold(self.path, off)
            if fd is None:
                raise CheckpointWriteError(f"slot {s} of model {self._entry_name(i)!r} in pool {self.path} is "
                                           "being written by another process")
            self._claimed[(i, s)] = fd  # held until sealed or given up: a repack leaves the slot alone
            self.native.store8(off, 0)  # invalid from here on: its old bytes are about to go
            self.native.write(off, desc.encode())  # counter 0: claimed, not sealed
            return s, desc

    def unclaim(self, i: int, s: int) -> None:
        """The writer of slot s is done with it (sealed, or given up: then the claim is torn and
        repack may reclaim its room)."""
        fd = self._claimed.pop((i, s), None)
        if fd is not None:
            claims.let_go(fd)

    def seal(self, i: int, s: int, desc: L.Slot) -> None:
        """Persists the descriptor (its CRC covers desc.counter), then stores the counter word
        alone: the version exists from that 8-byte store on, and not a moment before."""
        off = L.slot_off(i, s)
        raw = desc.encode()
        self.native.write(off + 8, raw[8:])  # everything but the counter word (still 0)
        self.native.store8(off, desc.counter)
        self.unclaim(i, s)

    def flip(self, i: int, s: int, counter: int, moved: bool = False) -> None:
        """Makes (counter, slot) the model's current version; never moves backwards
        (moved=True: repack's move of the current version to another slot, same counter)."""
        with self.locked():
            cur = self.active(i)
            if cur is not None and (cur[0] > counter or (cur[0] == counter and not moved)):
                return
            self.native.store8(L.entry_off(i) + 8, L.pack_active(counter, s))

    # -- repack --------------------------------------------------------------
    def repack(self, drop: tuple[str, ...] = ()) -> dict:
        """Reclaims space, online-safe (writers in other processes wait on the lock, and no
        model's current version is ever without a sealed copy): drops the named models,
        releases every sealed version older than its model's current one and every torn one
        (claimed, never sealed, its writer gone: claims.py), then moves current
        versions down into the lowest gap that fits (copy, persist, seal a second slot with the
        same counter, flip to it, release the old slot). Returns what it did."""
        with self.locked():
            dropped = [n for n in drop if self.drop(n)]
            released = torn = moved = 0
            before = self.free_bytes()
            probe = os.open(self.path, os.O_RDWR)
            try:
                for name, i in self.models().items():
                    act = self.active(i)
                    for s in range(L.SLOTS):
                        desc, sealed = self.slot(i, s)
                        if sealed and act is not None and desc.counter < act[0]:
                            self._blank(i, s)
                            released += 1
                        elif (not sealed and desc.extents() and (act is None or act[1] != s)
                              and claims.abandoned(probe, L.slot_off(i, s))):
                            self._blank(i, s)
                            torn += 1
            finally:
                os.close(probe)
            current = []
            for name, i in self.models().items():
                act = self.active(i)
                if act is not None:
                    desc, sealed = self.slot(i, act[1])
                    if sealed and desc.counter == act[0]:
                        current.append((min(desc.meta_off, desc.data_off), i, act[1], desc))
            for _, i, s, desc in sorted(current):
                moved += self._move_down(i, s, desc)
            return {"dropped": dropped, "released": released, "torn": torn, "moved": moved,
                    "free_before": before, "free_after": self.free_bytes()}

    def _blank(self, i: int, s: int) -> None:
        off = L.slot_off(i, s)
        self.native.store8(off, 0)
        self.native.write(off, bytes(L.SLOT_BYTES))

    def _move_down(self, i: int, s: int, desc: L.Slot) -> int:
        empty = [t for t in range(L.SLOTS) if t != s and self.slot(i, t)[0].counter == 0
                 and not self.slot(i, t)[0].extents()]
        if not empty:
            return 0
        room = self._fit_pair(self._used_extents(skip=(i, s)), desc.meta_cap, desc.data_cap)
        if room is None or room[1] >= desc.data_off:
            return 0
        m, d = room
        t = empty[0]
        new = L.Slot(**{**desc.__dict__, "meta_off": m, "data_off": d})
        off_t = L.slot_off(i, t)
        self.native.write(off_t, L.Slot(meta_off=m, meta_cap=new.meta_cap, data_off=d,
                                        data_cap=new.data_cap).encode())  # claimed: room is taken
        for dst, src, n in ((m, desc.meta_off, desc.meta_len + desc.extra_len), (d, desc.data_off, desc.data_len)):
            if n:
                _native.copy(self.address(dst), self.address(src), n, 4)
                self.native.persist(dst, n)
        self.seal(i, t, new)
        self.flip(i, t, new.counter, moved=True)
        self._blank(i, s)
        return 1

    # -- bytes ---------------------------------------------------------------
    def write_at(self, off: int, data: bytes) -> None:
        self.native.write(off, data)

    def read_at(self, off: int, n: int) -> bytes:
        if off < 0 or n < 0 or off + n > self.size:
            raise CorruptCheckpointError(f"{self.path}: a descriptor points outside the pool")
        return bytes(self.view[off:off + n])

    def address(self, off: int) -> int:
        return self.native.address + off
