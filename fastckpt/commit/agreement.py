"""Agreement between ranks through the job's own torch.distributed process group.

Owns two gloo groups made from the default group at construction (collective,
main thread): one for decisions taken in the caller's thread (skip or not, the
starting counter, which checkpoint to load, a part sent by its partner when loading)
and one used only by the commit thread, which processes checkpoints in counter order
on every rank (a replica sent to its partner), so the collectives of the two threads
never interleave on one group.
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist


class Agreement:
    """Single-process stand-in: every question is answered locally."""

    rank, world_size = 0, 1

    def all_ok(self, ok: bool, background: bool = False) -> bool:
        return ok

    def all_min(self, values: list) -> list:
        """Each value's minimum over every rank, in one all-reduce (a maximum: negate it)."""
        return list(values)

    def gather(self, obj, background: bool = False) -> list:
        return [obj]

    def broadcast(self, obj):
        return obj

    def exchange(self, sends: list, recvs: list, background: bool = False) -> None:
        """Point to point: each (tensor, rank) of sends sent to that rank, each (tensor, rank) of
        recvs filled from it, all at once (a rank may both send and receive); every rank the
        pairs name calls it with the matching pairs. Alone, there is nobody to exchange with."""
        if sends or recvs:
            raise ValueError("a process alone has no rank to exchange with")

    def close(self) -> None:
        pass


class DistAgreement(Agreement):
    def __init__(self, timeout_s: float = 600.0):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        timeout = timedelta(seconds=timeout_s)
        self._main = dist.new_group(backend="gloo", timeout=timeout)
        self._bg = dist.new_group(backend="gloo", timeout=timeout)

    def _group(self, background: bool):
        return self._bg if background else self._main

    def all_ok(self, ok: bool, background: bool = False) -> bool:
        t = torch.tensor([1 if ok else 0], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self._group(background))
        return bool(t.item())

    def all_min(self, values: list) -> list:
        t = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self._main)
        return [int(v) for v in t.tolist()]

    def gather(self, obj, background: bool = False) -> list:
        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self._group(background))
        return out

    def broadcast(self, obj):
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self._main)
        return box[0]

    def exchange(self, sends: list, recvs: list, background: bool = False) -> None:
        group = self._group(background)
        works = [dist.isend(t, dst=r, group=group) for t, r in sends]
        works += [dist.irecv(t, src=r, group=group) for t, r in recvs]
        for w in works:
            w.wait()

    def close(self) -> None:
        for g in (self._main, self._bg):
            try:
                dist.destroy_process_group(g)
            except (RuntimeError, ValueError):
                pass


def spread() -> bool:
    """Whether more than one rank runs (torch.distributed is up with a world of 2 or more)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def make_agreement(timeout_s: float = 600.0) -> Agreement:
    return DistAgreement(timeout_s) if spread() else Agreement()
