"""Concurrency slots: at most `concurrency` saves staged or in flight at once — the one bound
every fastckpt front end draws from: the Checkpointer (a slot per checkpoint, given back when
it commits) and DCP's FastStager (a slot per snapshot, given back once DCP's save is done with it).

A slot is an object made by the owner's `make(index)` the first time fewer than the bound
exist, and reused from then on. Each is FREE or TAKEN; `take()` moves one FREE -> TAKEN, `give_back()` TAKEN ->
FREE, and nothing else moves them. When every slot is taken:
  policy 'skip'   take() returns None at once;
  policy 'wait'   take() waits, through the caller's own wait (its Deadline's), for one to be
                  given back, and returns None when that wait gives up.
A holder that cannot say when it is done (a snapshot freed by whoever drops it last) is asked
instead: take() first calls the owner's `reclaim()`, which gives back the slots whose holders
are done, and calls it again each time its wait wakes. The bound of one take can be lower than
`concurrency` (`limit`: staging_mb's worth of snapshots of that size), never higher.

Across ranks, whether every rank got what its save needs is agreed by the owner's agreement
(`kept_if_every_rank_has_one`, its slot given back where not): the Checkpointer's policy 'skip'
and DCP's FastStager, whose collectives must start on every rank or on none.

One condition guards the slots (`changed`): an owner that keeps more state per slot guards it
with the same one, and notifies it when a slot may have become free.
"""
from __future__ import annotations

import threading
from typing import Callable, Generic, Optional, TypeVar

from ..errors import ConfigError
from .native_engine import MiB

S = TypeVar("S")
# the caller's wait: calls attempt(seconds) until it returns True (then True) or it gives up (False)
Wait = Callable[[Callable[[float], bool]], bool]


def limit_for(concurrency: int, staging_mb: Optional[int], nbytes: int) -> int:
    """Slots for saves of `nbytes` each: `concurrency`, fewer when staging_mb holds fewer such saves
    (at least one, so a save larger than staging_mb still goes through, alone)."""
    if staging_mb is None or nbytes <= 0:
        return concurrency
    return max(1, min(concurrency, staging_mb * MiB // nbytes))


class ConcurrencySlots(Generic[S]):
    """Args:
        concurrency: the most slots taken at once (>= 1).
        make: makes slot `index` the first time it is needed (default: the index itself).
        reclaim: gives back the slots whose holders are done (called with `changed` held);
            None when every holder gives its slot back itself.
    """

    def __init__(self, concurrency: int, make: Callable[[int], S] = lambda i: i,
                 reclaim: Optional[Callable[[], None]] = None):
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
            raise ConfigError(f"concurrency must be an integer >= 1, got {concurrency!r}")
        self.concurrency = concurrency
        self._make, self._reclaim = make, reclaim
        self.changed = threading.Condition()
        self._all: list[S] = []
        self._taken: list[S] = []

    def take(self, wait: Optional[Wait] = None, limit: Optional[int] = None) -> Optional[S]:
        """A free slot, now TAKEN; None when none is free (wait None: at once, policy 'skip'; else
        once `wait` gave up)."""
        bound = self.concurrency if limit is None else max(1, min(limit, self.concurrency))
        got: list[S] = []

        def attempt(seconds: float) -> bool:
            with self.changed:
                slot = self._free_now(bound)
                if slot is None and seconds > 0:
                    self.changed.wait(seconds)
                    slot = self._free_now(bound)
                if slot is not None:
                    self._taken.append(slot)
                    got.append(slot)
                return slot is not None

        if attempt(0.0) or (wait is not None and wait(attempt)):
            return got[0]
        return None

    def give_back(self, slot: S) -> None:
        """TAKEN -> FREE (a slot given back twice is a bug of the owner's)."""
        with self.changed:
            if slot not in self._taken:
                raise RuntimeError("fastckpt: a concurrency slot was given back that is not taken")
            self._taken.remove(slot)
            self.changed.notify_all()

    def kept_if_every_rank_has_one(self, slot: Optional[S], have: bool, all_ok: Callable[[bool], bool]) -> bool:
        """Whether every rank has what a save needs (this rank: `have`, with `slot` taken, or None),
        asked through `all_ok`, the owner's agreement; this rank's slot is given back when some rank
        has not, or when the asking itself fails (a peer gone). A save skipped or refused is then
        so on every rank, before any of them starts the save's collectives."""
        everyone = False
        try:
            everyone = all_ok(have)
        finally:
            if slot is not None and not everyone:
                self.give_back(slot)
        return everyone

    def taken(self) -> list[S]:
        """The slots taken now, oldest take first."""
        with self.changed:
            return list(self._taken)

    def every(self) -> list[S]:
        """Every slot made so far, free or taken."""
        with self.changed:
            return list(self._all)

    def forget_all(self) -> None:
        """Drops every slot (the owner closed): the next take makes new ones."""
        with self.changed:
            self._all, self._taken = [], []
            self.changed.notify_all()

    def _free_now(self, bound: int) -> Optional[S]:
        if self._reclaim is not None:
            self._reclaim()
        if len(self._taken) >= bound:
            return None
        free = next((s for s in self._all if s not in self._taken), None)
        if free is None and len(self._all) < self.concurrency:
            free = self._make(len(self._all))
            self._all.append(free)
        return free
