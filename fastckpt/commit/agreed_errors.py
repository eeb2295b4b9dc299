"""Background write errors raised at the same call on every rank, or on none.

A checkpoint's commit lands on each rank's own commit thread (fastckpt.commit.ordered): its
outcome is the same everywhere — the ranks agree on it in one collective — but the moment each
rank's thread records it is not. Raised as each thread recorded it, a failed checkpoint would
stop the rank whose thread was quicker while the other goes on into the framework's next
collective (DeepSpeed's tag check, Lightning's barrier) and waits there until the process
group's timeout. So a caller that every rank reaches at once (the next save) asks `agreed()`:
each rank says which units failed here, in one collective on the agreement's main group (one
all-reduce when none failed anywhere, a gather only when one did), and every rank raises for
every unit that failed on any rank — its own error, or what the rank that had it said. A unit
raised that way before its failure landed here is not raised again when it does.

Units are named by a key every rank gives the same unit (its place in the one commit order):
the Checkpointer's checkpoints by counter, DeepSpeed's tags by the order they were submitted.
`take_local()` hands over what landed here without a collective: for waits that let every
unit land first (wait(), close()), where every rank holds the same failures already.
"""
from __future__ import annotations

import threading
from typing import Callable, Hashable, Optional

from ..errors import CheckpointWriteError
from .agreement import Agreement


class AgreedErrors:
    def __init__(self, agreement: Agreement):
        self._agree = agreement
        self._lock = threading.Lock()
        self._landed: dict = {}  # key -> (error, seen()): failed here, not yet handed over
        self._raised: set = set()  # raised at an agreed call before their failure landed here

    def landed(self, key: Hashable, error: BaseException, seen: Optional[Callable[[], bool]] = None) -> None:
        """Unit `key` failed on this rank (its commit thread). seen(): whether a caller has already
        been given this error some other way (its Pending's wait()): then it is not raised again."""
        with self._lock:
            if key in self._raised:
                self._raised.discard(key)
                return
            self._landed[key] = (error, seen)

    def _unseen(self) -> dict:
        return {k: e for k, (e, seen) in self._landed.items() if seen is None or not seen()}

    def take_local(self) -> list[BaseException]:
        """Every failure landed here and not yet handed over, in commit order (no collective)."""
        with self._lock:
            unseen, self._landed = self._unseen(), {}
        return [unseen[k] for k in sorted(unseen)]

    def agreed(self, step: Optional[int] = None) -> list[BaseException]:
        """Every rank, at one call: the failures to raise now, the same units on every rank, in
        commit order (each rank its own error where it has it, else what another rank said).
        step: the step each rank is about to save, checked the same on every rank in the same
        all-reduce (a ValueError last when it is not: one checkpoint would hold several steps; a
        step that is not an int counts as 0, so None beside an int is unequal too)."""
        if self._agree.world_size < 2:
            return self.take_local()
        with self._lock:
            mine = {k: f"{e}" for k, e in self._unseen().items()}
        said = step if isinstance(step, int) and not isinstance(step, bool) else 0
        ok, low, high = self._agree.all_min([int(not mine), said, -said])
        unequal = [] if low == -high else [ValueError(
            f"save() was called with step {low} on one rank and step {-high} on another: every rank saves "
            "the same step together (nothing of this save was written)")]
        if ok:
            return unequal
        failed: dict = {}
        for rank, items in enumerate(self._agree.gather(sorted(mine.items()))):
            for key, said in items:
                failed.setdefault(key, (rank, said))
        out = []
        with self._lock:
            for key in sorted(failed):
                entry = self._landed.pop(key, None)
                if entry is not None:
                    out.append(entry[0])
                    continue
                self._raised.add(key)  # its failure lands here later: not raised twice
                rank, said = failed[key]
                out.append(CheckpointWriteError(f"{said} (said by rank {rank}; every rank raises it here, at the "
                                                "same call)"))
        return out + unequal


def report_each(errors: list, report: Optional[Callable[[BaseException], None]]) -> None:
    """Each error through report (its owner's: raise or warn, as on_error says); without one, the
    first is raised."""
    for e in errors:
        if report is None:
            raise e
        report(e)
