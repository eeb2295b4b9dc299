"""The copies of a Checkpointer's checkpoints behind its memory tier (setting `tiers`).

Each checkpoint committed on the memory tier is handed here as it lands (on its commit thread, in
commit order: the same on every rank). The ones the cadence picks (persist_every:
fastckpt.commit.persist_cadence) are copied to the tiers behind it by a PersistCommit
(fastckpt.commit.persist_unit), one after another on an ordered commit of their own, whose
collectives run on groups apart from the commits'. What landed is counted in the owner's stats
(persisted, persist_superseded, persist_failed, persist_skipped), and each failure goes to the
owner's errors (fastckpt.commit.agreed_errors), reported on its caller's thread.
"""
from __future__ import annotations

from typing import Callable, Optional

from ..errors import CheckpointWriteError
from ..pending import Pending
from ..write.deadline import Deadline
from .agreed_errors import AgreedErrors
from .agreement import Agreement, make_agreement
from .ordered import OrderedCommits
from .persist_cadence import PersistCadence
from .persist_unit import Superseded


class Persisting:
    def __init__(self, store, deadline: Deadline, config, count: Callable[[str], None],
                 retain: Callable[[], None], errors: AgreedErrors):
        """store: a tiered store (persist_unit; behind() with persist_every > 1, which the settings
        allow only there); config: the Checkpointer's settings; count(key): adds one to the owner's
        stats; retain(): retention once a copy landed, on every tier; errors: where a failed copy
        goes (by its checkpoint's counter), for the owner to raise."""
        self._agree = make_agreement(config.commit_timeout_s) if config.distributed is not False else Agreement()
        self._units = OrderedCommits(self._agree, deadline, config.commit_timeout_s, name="fastckpt-persist")
        self._cadence = PersistCadence(config.persist_every) if config.persist_every > 1 else None
        self._store, self._count, self._retain, self._errors = store, count, retain, errors

    def landed(self, pending: Pending) -> bool:
        """A checkpoint just committed (its commit thread, in commit order): its copy behind is
        issued now — before it leaves the in-flight list, so that wait() finds it — or the cadence
        leaves it in memory alone. True when a copy was issued: its Pending is placed once the copy
        lands; else its owner places it now."""
        if self._cadence is not None and not self._cadence.due(pending.info, on_last_tier=not self._store.behind()):
            self._count("persist_skipped")  # in memory alone until a newer one replaces it
            return False

        def copied(unit, infos, error):
            self._copied(unit, infos, error, seen=lambda: pending.placed_observed)
            pending.placed(error)
        return self._issue(pending.info, copied) is not None

    def issue_owed(self) -> bool:
        """The newest checkpoint the cadence left in memory alone, copied behind now (close(), and
        so a preemption); True when a copy was issued (join() waits for it)."""
        owed = self._cadence.owed() if self._cadence is not None else None
        return owed is not None and self._issue(owed, self._copied) is not None

    def join(self) -> None:
        """Until every copy issued so far has landed (its threads stay for the next)."""
        self._units.join(retire=False)

    def close(self) -> None:
        """After the owner's wait(): every copy issued has landed, then its threads end."""
        self._units.join()
        self._agree.close()

    def _issue(self, info, landed) -> Optional[object]:
        unit = self._store.persist_unit(info, landed, self._retain,
                                        lambda ok: self._agree.all_ok(ok, background=True))
        if unit is not None:  # nothing behind (the save went to the last tier): None
            self._units.issue(unit)
        return unit

    def _copied(self, unit, infos, error, seen=None) -> None:
        """A copy landed (its commit thread); seen(): whoever waits for its checkpoint to be placed
        was given the error (Pending.raise_placed): the owner does not raise it again."""
        if error is None:
            self._count("persisted")
        elif isinstance(error, Superseded):  # a newer one was copied instead
            self._count("persist_superseded")
        else:
            self._count("persist_failed")
            self._errors.landed((1, unit.info.counter), CheckpointWriteError(
                f"{unit.label} failed: {error}; the checkpoint stays in the memory tier, and the newest "
                "copy behind it stays the latest there"), seen)
