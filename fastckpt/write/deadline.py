"""Deadlines for the waits of the write path: a wait that sees nothing move fails, it never hangs.

Owns `Deadline` (how long a wait may go without progress: the Checkpointer's
`stall_timeout_s`) and `WriteStalled`, the CheckpointWriteError it raises, which names what
was waited for and where it stood. Progress is a counter the waiter can read — the native
engine's units copied and written, plus what a write's own threads move (CUDA chunks fed,
kvikio writes done) — so a long checkpoint on a slow disk never trips it, while a writer
stuck in the kernel, a copy waiting for staging that nobody frees, or a latch nobody sets
does, after `stall_s`. Waits run in slices (native waits release the GIL), so a wait still
returns the moment its condition holds.
"""
from __future__ import annotations

import time
from typing import Callable, Union

from ..errors import CheckpointWriteError, ConfigError

DEFAULT_STALL_S = 120.0  # the Checkpointer's stall_timeout_s unless set
SLICE_S = 0.25  # longest single slice of a wait; shorter when the deadline itself is short

What = Union[str, Callable[[], str]]


class WriteStalled(CheckpointWriteError):
    """A wait of the write path saw no progress for the deadline: the checkpoint is abandoned."""


class Deadline:
    """How long any wait of the write path may go without progress.

    Args:
        stall_s: seconds without progress after which a wait fails with WriteStalled.
        progress: a counter that grows whenever any byte of any checkpoint moves.
    """

    def __init__(self, stall_s: float, progress: Callable[[], int] = lambda: 0):
        if not isinstance(stall_s, (int, float)) or isinstance(stall_s, bool) or not stall_s > 0:
            raise ConfigError(f"stall_timeout_s must be a number > 0, got {stall_s!r}")
        self.stall_s = float(stall_s)
        self.progress = progress
        self._own = 0  # what write threads outside the native engine moved (moved())

    def moved(self) -> None:
        """A write's own thread moved something (a CUDA chunk fed, a kvikio write done)."""
        self._own += 1

    def seen(self) -> int:
        """Everything moved so far: the counter's progress and what moved() counted."""
        return self.progress() + self._own

    def wait(self, what: What, attempt: Callable[[float], bool], timeout: float | None = None,
             slack: float = 0.0) -> bool:
        """Calls attempt(seconds) — one wait of at most that long, True once its condition
        holds — until it returns True. Returns False once the caller's own `timeout` (None:
        none) has passed. Raises WriteStalled when nothing moved for stall_s + slack (slack:
        for waits that include other ranks, whose progress this process cannot see)."""
        limit = self.stall_s + slack
        piece = min(SLICE_S, max(limit / 8, 0.001))
        start = last_move = time.monotonic()
        seen = self.seen()
        while True:
            step = piece
            if timeout is not None:
                step = max(0.0, min(step, start + timeout - time.monotonic()))
            if attempt(step):
                return True
            now = time.monotonic()
            if timeout is not None and now - start >= timeout:
                return False
            moved = self.seen()
            if moved != seen:
                seen, last_move = moved, now
            elif now - last_move >= limit:
                text = what() if callable(what) else what
                raise WriteStalled(f"{text}: nothing moved for {limit:g} s (stall_timeout_s="
                                   f"{self.stall_s:g}); the checkpoint is abandoned and the previous "
                                   "one stays the latest")

    def sleep_until(self, what: What, ready: Callable[[], bool]) -> None:
        """Polls ready() (e.g. a CUDA event's query()) with short sleeps until it holds, under
        this deadline."""
        pause = 0.0002

        def attempt(seconds: float) -> bool:
            nonlocal pause
            end = time.monotonic() + seconds
            while not ready():
                if time.monotonic() >= end:
                    return False
                time.sleep(pause)
                pause = min(pause * 2, 0.002)
            return True

        self.wait(what, attempt)
