"""Pending: the handle save() returns for one checkpoint in flight."""
from __future__ import annotations

import threading

from .commit import CommitInfo


class Pending:
    """A checkpoint being taken. done() / wait() -> CommitInfo; copied() for the gate."""

    def __init__(self, step: int, counter: int, prev: "Pending | None" = None, skipped: bool = False):
        self.step, self.counter, self.prev = step, counter, prev
        self._copied = threading.Event()
        self._done = threading.Event()
        self._info: CommitInfo | None = None
        self._error: BaseException | None = None
        self.observed = False
        self.skipped = skipped
        if skipped:
            self._copied.set()
            self._done.set()

    def done(self) -> bool:
        """True once the checkpoint is committed, failed, or was skipped."""
        return self._done.is_set()

    def copied(self) -> bool:
        """True once the snapshot no longer reads the caller's tensors."""
        return self._copied.is_set()

    def wait_copied(self, timeout: float | None = None) -> bool:
        return self._copied.wait(timeout)

    def wait(self, timeout: float | None = None) -> CommitInfo | None:
        """Blocks until committed; returns its CommitInfo (None if skipped) or raises its error."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"checkpoint of step {self.step} still in flight after {timeout}s")
        self.observed = True
        if self._error is not None:
            raise self._error
        return self._info

    @property
    def error(self) -> BaseException | None:
        return self._error

    def _finish(self, info: CommitInfo | None, error: BaseException | None) -> None:
        self._info, self._error = info, error
        self._copied.set()
        self._done.set()

    def __repr__(self) -> str:
        state = "skipped" if self.skipped else "done" if self.done() else "in flight"
        return f"Pending(step={self.step}, counter={self.counter}, {state})"
