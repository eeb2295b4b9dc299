"""A checkpoint on a signal (settings `preempt_signal`, `preempt_grace_s`): spot and preemptible
capacity sends SIGTERM and kills the job a grace period later.

Owns the signal's handler and the clock of the grace period. The handler only notes that the
signal came and when (no I/O, no lock, no collective: it runs between two bytecodes of whatever
the main thread was doing, a save included), and leaves the signal's default action in place for
the next. A second signal, or the grace period running out, ends the process at once (its status:
killed by that signal), even inside a collective: whatever was in flight is
abandoned, and since a checkpoint's record is written last, the previous one stays the latest —
never a torn one. `at_step_end` is the sequence every front end runs after a training step (the
Checkpointer's, DeepSpeed's, DCP's Preemption, Lightning's callback): the agreement, the grace
period, the checkpoint, the exit; each front end says how its ranks agree and how it saves.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Callable, Optional

log = logging.getLogger("fastckpt")


def signal_number(value) -> Optional[int]:
    """A signal as the settings may give it (15, "SIGTERM", "TERM", signal.SIGTERM, None)."""
    if value is None:
        return None
    if isinstance(value, str):
        name = value.upper()
        name = name if name.startswith("SIG") else f"SIG{name}"
        return int(getattr(signal, name))
    return int(value)


def _die(signum: int) -> None:
    """The process ends now, as the signal's default action would end it."""
    try:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        time.sleep(1.0)  # delivered before the sleep ends; for a signal whose default does not end a process:
    finally:
        os._exit(128 + signum)


class PreemptSignal:
    """The handler of one signal, installed on the main thread; `arrived` once it came."""

    def __init__(self, signum: int, grace_s: float):
        if threading.current_thread() is not threading.main_thread():
            raise ValueError("preempt_signal needs the Checkpointer made on the main thread (Python runs "
                             "signal handlers there)")
        self.signum, self.grace_s = signum, grace_s
        self.arrived: Optional[float] = None  # time.monotonic() of the first signal to this process
        self.started: Optional[float] = None  # the grace period's start: that, or another rank's signal agreed
        self._previous = signal.signal(signum, self._handle)
        self._watch: Optional[threading.Thread] = None

    def _handle(self, signum, frame) -> None:
        if self.arrived is not None:
            _die(signum)  # a second signal: out now
        self.arrived = time.monotonic()
        if self.started is None:
            self.started = self.arrived
        # the next one ends the process in the kernel, even while this thread is inside a
        # collective (a Python handler runs only once the interpreter gets its thread back)
        signal.signal(signum, signal.SIG_DFL)

    def anyone(self, collective) -> bool:
        """Whether the signal came to any rank: collective(came here) -> came anywhere (one
        collective). When it fails because a peer is gone and the signal came here, the process
        ends as the signal would end it (no checkpoint can be agreed on any more)."""
        try:
            return bool(collective(self.arrived is not None))
        except Exception:
            if self.arrived is not None:
                _die(self.signum)
            raise

    def left_s(self) -> float:
        """Seconds of the grace period left (all of it before it started)."""
        if self.started is None:
            return self.grace_s
        return self.grace_s - (time.monotonic() - self.started)

    def watch(self) -> None:
        """The ranks agreed the signal came (here or to another rank): the grace period runs from
        its start (now, if the signal came to another rank only), and when it runs out the process
        ends. A signal that comes here after is this process's first, not its second."""
        if self.started is None:
            self.started = time.monotonic()
        if self._watch is not None:
            return

        def run():
            time.sleep(max(0.0, self.left_s()))
            _die(self.signum)
        self._watch = threading.Thread(target=run, name="fastckpt-preempt-grace", daemon=True)
        self._watch.start()

    def exit(self) -> None:
        """The checkpoint is durable: the process ends with the signal's status."""
        _die(self.signum)

    def at_step_end(self, any_rank: Callable[[bool], bool], what: str, save: Callable[[], object]) -> None:
        """Every rank, after a training step: nothing unless the signal came to some rank
        (any_rank(came here) -> came anywhere: one collective). Then the grace period runs,
        `save()` checkpoints `what` (durable, the ranks met, when it returns) and the process ends
        with the signal's status; a save that fails is logged, and the previous checkpoint stays
        the latest."""
        if not self.anyone(any_rank):
            return
        self.watch()  # the grace period runs (from now, if another rank got the signal)
        log.warning("fastckpt: preempted (signal %d): checkpointing %s, then exiting (%.1f s of grace left)",
                    self.signum, what, self.left_s())
        try:
            save()
        except BaseException as e:  # noqa: BLE001 - the process ends either way; the previous checkpoint stands
            log.error("fastckpt: the checkpoint of %s on preemption failed: %s; the previous one stays the latest",
                      what, e)
        self.exit()

    def uninstall(self) -> None:
        """The signal's previous handler back (not once the signal came: the process is ending)."""
        if threading.current_thread() is threading.main_thread() and self.arrived is None:
            signal.signal(self.signum, self._previous)
