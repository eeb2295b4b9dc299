"""Replicas of memory-tier parts in a partner's memory tier (settings `replicas=1`).

Owns the bytes that move between partners (fastckpt.store.partners says who keeps whose):
- at commit (`exchange`, on the commit thread, over the agreement's background group, in commit
  order on every rank): each rank sends its durable part to its partner and receives its wards'
  parts, each written beside its own part in its memory-tier folder and CRC-checked on arrival
  against the checkpoint's record; one that fails is removed, with a warning (that checkpoint
  then has no replica of that part), and the commit goes on;
- at load (`fetch`, on the caller's thread, over the main group, every rank): the ranks whose own
  memory-tier copy is gone or bad ask their partners, who send the replicas they keep; the bytes
  are written into the asking rank's memory tier (which so holds that checkpoint again once it
  verifies) and read back, CRC-checked.
Parts are sent from a mapping of the file (no copy of their own) as uint8 tensors: on a memory
filesystem the mapping the part's save left held (the native memory_maps.h). There, a ward's part
is also received straight into its file's mapping (a removed part's file recycled, its mapping
held on for the next): no buffer, no write() of it, no fresh zeroed pages per save.
"""
from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import shutil
import warnings
from typing import Callable, Optional

import torch

from .. import _native
from ..commit import record as commit
from ..commit_info import CommitInfo
from ..errors import CorruptCheckpointError
from ..verify import verify_file
from .tier_copy import write_durably

log = logging.getLogger("fastckpt")


def mapped(path: str) -> torch.Tensor:
    """The file's bytes as a uint8 tensor over a private mapping."""
    size = os.path.getsize(path)
    if size == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage.from_file(path, False, size))


def at_address(at: int, size: int) -> torch.Tensor:
    """size bytes at address `at` (a held mapping) as a uint8 tensor, nothing copied."""
    return torch.frombuffer((ctypes.c_uint8 * size).from_address(at), dtype=torch.uint8)


class HeldParts:
    """Tensors over memory-tier files' held mappings, given back together (`with`)."""

    def __init__(self):
        self._held: list[int] = []

    def __enter__(self) -> "HeldParts":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:  # a transfer may still write there: never given back (never unmapped)
            self._held.clear()
            return
        for at in self._held:
            _native.give_back_memory_map(at)
        self._held.clear()

    def sent(self, path: str) -> torch.Tensor:
        """A part to send: over the mapping its save left held, else a mapping of its own."""
        size = os.path.getsize(path)
        at = _native.find_memory_map(path, size) if size else 0
        if not at:
            return mapped(path)
        self._held.append(at)
        return at_address(at, size)

    def received(self, path: str, size: int) -> tuple[torch.Tensor, int]:
        """Where a part sent here lands: its file at path (created, or a recycled one cut to size),
        reserved and mapped; (the tensor over it, its address)."""
        at = _native.take_memory_map(path, size)
        self._held.append(at)
        return at_address(at, size), at


class Replicas:
    """This rank's side of the replicas: tier is its memory-tier folder (a NodeTier)."""

    def __init__(self, tier, agreement, partner_of: list, wards: list[int]):
        self.tier, self.agree, self.partner_of, self.wards = tier, agreement, partner_of, wards
        self.rank = agreement.rank
        self.partner = partner_of[self.rank]

    # -- at commit -----------------------------------------------------------
    def exchange(self, folder: str, info: CommitInfo) -> None:
        """Every part durable (record() of the commit): this rank's part to its partner, its
        wards' parts kept in folder, each checked."""
        with HeldParts() as held:
            self._exchange(folder, info, held)

    def _exchange(self, folder: str, info: CommitInfo, held: HeldParts) -> None:
        mine = held.sent(os.path.join(folder, info.entry_for(self.rank).name))
        in_place = self.tier.sink_kind == "memory"  # received straight into the file's mapping
        bufs, failed = {}, {}
        for w in self.wards:
            entry = info.entry_for(w)
            path = os.path.join(folder, entry.name)
            try:
                if in_place and entry.bytes:
                    self.tier.recycle_into(path)
                    bufs[w] = held.received(path, entry.bytes)
                else:
                    buf = torch.empty(entry.bytes, dtype=torch.uint8)
                    bufs[w] = (buf, buf.data_ptr())
            except OSError as e:  # no room for it here: received, then dropped
                failed[w] = e
                buf = torch.empty(entry.bytes, dtype=torch.uint8)
                bufs[w] = (buf, buf.data_ptr())
        self.agree.exchange([(mine, self.partner)], [(b, w) for w, (b, _) in bufs.items()], background=True)
        for ward, (buf, at) in bufs.items():
            entry = info.entry_for(ward)
            path = os.path.join(folder, entry.name)
            try:
                if ward in failed:
                    raise failed[ward]
                if not (in_place and entry.bytes):
                    write_durably(path, at, buf.numel(), direct_io=False)
                verify_file(path, entry, at=at)  # the CRCs over the bytes as received
            except (CorruptCheckpointError, OSError) as e:
                _drop(path)
                say = (f"the replica of rank {ward}'s part of step {info.step} failed its check on arrival in "
                       f"{path}: {e}; that part has no replica in this checkpoint")
                log.warning("fastckpt: %s", say)
                warnings.warn(f"fastckpt: {say}", stacklevel=2)

    def kept(self) -> dict[int, tuple[CommitInfo, tuple[int, ...]]]:
        """counter -> (record, the wards whose part is kept here with its recorded size)."""
        out = {}
        for info in self.tier.committed():
            held = []
            for ward in self.wards:
                try:
                    entry = info.entry_for(ward)
                    if os.path.getsize(os.path.join(info.path, entry.name)) == entry.bytes:
                        held.append(ward)
                except (CorruptCheckpointError, OSError):
                    continue
            if held:
                out[info.counter] = (info, tuple(held))
        return out

    # -- at load ------------------------------------------------------------
    def fetch(self, info: CommitInfo, routes: list, need: bool, tried: list, read: Callable, ask: dict):
        """Every rank: those that need their part (need, and their partner keeps it: routes)
        receive it from their partner; returns this rank's state read from it, or None."""
        asking = self.agree.gather(bool(need and routes[self.rank][1] is not None))
        sends = []
        if any(asking[w] for w in self.wards):
            here = {i.counter: i for i in self.tier.committed()}.get(info.counter)
            for ward in self.wards:
                if asking[ward]:
                    sends.append((self._kept_part(here, info, ward), ward))
        with HeldParts() as held:
            landed = self._received(info, asking[self.rank], sends, held, tried)
        if landed is None:
            return None
        folder, path = landed
        state = read(info, path, self.partner, tried, ask)
        if state is None:
            shutil.rmtree(folder, ignore_errors=True)
            return None
        try:  # its memory tier holds the checkpoint again
            commit.write(dataclasses.replace(info, path=folder))
        except OSError as e:
            log.warning("fastckpt: could not keep the part its partner sent in %s: %s", folder, e)
        return state


    def _received(self, info: CommitInfo, asking: bool, sends: list, held: HeldParts, tried: list):
        """The exchange of fetch(): this rank's part, when it asked for it, lands in a new folder of
        its memory tier — on tmpfs straight into its file's mapping — (folder, path); else None."""
        size = info.entry_for(self.rank).bytes
        folder = path = None
        buf, failed = None, None
        if asking:
            try:  # inside: every rank still joins the exchange below
                folder = self.tier.new_dir(info.step, info.counter)
                path = os.path.join(folder, info.entry_for(self.rank).name)
                if self.tier.sink_kind == "memory" and size:
                    self.tier.recycle_into(path)
                    buf, _ = held.received(path, size)
            except OSError as e:  # no room here: received all the same (the exchange is collective)
                failed = e
            if buf is None:
                buf = torch.empty(size, dtype=torch.uint8)
        self.agree.exchange(sends, [(buf, self.partner)] if asking else [])
        if not asking:
            return None
        try:
            if failed is not None:
                raise failed
            if not (self.tier.sink_kind == "memory" and size):
                write_durably(path, buf.data_ptr(), buf.numel(), direct_io=False)
        except OSError as e:
            tried.append(f"replica of rank {self.partner}: {e}")
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
            return None
        return folder, path

    @staticmethod
    def _kept_part(here: Optional[CommitInfo], info: CommitInfo, ward: int) -> torch.Tensor:
        """The ward's part as kept here; gone since it was offered (never, short of a hand
        removing it): zeros of its size, which the ward's check refuses."""
        entry = info.entry_for(ward)
        try:
            part = mapped(os.path.join(here.path, entry.name))
            if part.numel() == entry.bytes:
                return part
        except (AttributeError, OSError):
            pass
        return torch.zeros(entry.bytes, dtype=torch.uint8)


def _drop(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
