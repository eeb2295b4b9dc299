"""A checkpoint on a signal for DCP's users (FSDP2, a training loop of one's own): `Preemption`.

    preemption = fastckpt.dcp.Preemption(signal.SIGTERM, grace_s=30)   # every rank, main thread
    for step in range(1, steps + 1):
        train_step(...)
        preemption.at_step_end(step, save=lambda s: dcp.save(state, checkpoint_id=f"{root}/step-{s}",
                                                              storage_writer=FastStorageWriter(root)),
                               in_flight=[saving.upload_completion for saving in async_saves])

The handler only notes the signal (fastckpt.preempt: no I/O, no collective). at_step_end asks
every rank — one all-reduce on a gloo group of its own, made with the Preemption (never the
default group, nor the one async saves talk on) — whether any got it; if one did, every rank
lets its async saves in flight finish, saves `step` through `save` (a blocking dcp.save into a
FastStorageWriter is committed when it returns), meets the others, and the process exits with the
signal's status. A second signal, or grace_s running out, ends the process at once: the commit
record being written last, the previous checkpoint stays the newest, never a torn one.
"""
from __future__ import annotations

import signal as signals
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, cast

import torch
import torch.distributed as dist

from ..commit.agreement import spread
from ..preempt import PreemptSignal
from ..settings import CheckpointerConfig

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


class Preemption:
    """The signal's handler and the step every rank agrees to save on it (see the module)."""

    def __init__(self, signal: int | str = signals.SIGTERM, grace_s: float = 30.0) -> None:
        checked = CheckpointerConfig(preempt_signal=signal, preempt_grace_s=grace_s)  # one spelling of the checks
        self.group: Optional[ProcessGroup] = dist.new_group(backend="gloo") if spread() else None
        # a signal given: the settings made it its number (CheckpointerConfig.__post_init__)
        self._signal = PreemptSignal(cast(int, checked.preempt_signal), checked.preempt_grace_s)

    def at_step_end(self, step: int, save: Callable[[int], object], in_flight: Iterable[Future[Any]] = ()) -> None:
        """Every rank, after every step: nothing unless the signal came to some rank; then the
        saves in flight (futures) finished, `save(step)` (blocking, committed when it returns),
        the ranks met, and exit."""
        def save_now() -> None:
            for future in in_flight:
                future.result()
            save(step)
            if self.group is not None:
                dist.barrier(group=self.group)
        self._signal.at_step_end(self._any_rank, f"step {step}", save_now)

    def _any_rank(self, came: bool) -> bool:
        got = torch.tensor([1 if came else 0])
        if self.group is not None:
            dist.all_reduce(got, op=dist.ReduceOp.MAX, group=self.group)
        return bool(got.item())

    def close(self) -> None:
        """The signal's previous handler back (nothing when the signal came)."""
        self._signal.uninstall()
