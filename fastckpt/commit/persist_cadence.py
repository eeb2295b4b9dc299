"""Which checkpoints committed on the memory tier are persisted behind it (setting `persist_every`).

Every save commits on the memory tier (and, with replicas=1, in a partner's memory); every
`persist_every`-th of them is also copied to the tiers behind it, as multi-level checkpointing
does (a killed process, the common failure, resumes from memory; the disk is for a lost node or
job). The count runs in commit order, the same on every rank, so every rank persists the same
checkpoints. The newest one the cadence left in memory alone is owed to the disk: close() (and a
preemption, which closes) persists it, unless a newer checkpoint went to the last tier itself.
"""
from __future__ import annotations

import threading
from typing import Optional

from ..commit_info import CommitInfo


class PersistCadence:
    def __init__(self, every: int):
        self.every = every
        self._since = 0  # memory-tier commits since the last one persisted
        self._owed: Optional[CommitInfo] = None
        self._lock = threading.Lock()

    def due(self, info: CommitInfo, on_last_tier: bool = False) -> bool:
        """A checkpoint just committed (its commit thread, in commit order): whether it is
        persisted now; if not, it is the one owed. One committed on the last tier itself (a
        preemption's, or after the memory tier filled) is due, with nothing to copy: nothing
        older is owed."""
        with self._lock:
            self._since += 1
            if on_last_tier or self._since >= self.every:
                self._since, self._owed = 0, None
                return True
            self._owed = info
            return False

    def owed(self) -> Optional[CommitInfo]:
        """The newest checkpoint left in memory alone, handed over once (None: none is owed)."""
        with self._lock:
            info, self._owed = self._owed, None
            return info
