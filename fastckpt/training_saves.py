"""TrainingSaves: checkpoints named by path, saved from inside a training loop — what both plugins do.

Owns the part of a save that depends on training going on around it (NamedCheckpoints owns
the rest). Before any optimizer step nothing changes the state, so a save is durable when it
returns. Once steps run, a save copies at once every tensor the optimizer update does not
write and leaves the update's own tensors to the background copy; the next update waits for
those copies (write.gate.StepGate calls the plugin's gate first). Until the run has shown
that nothing else writes those tensors between a save and the next step (write.watch), a
save waits for its copy before returning. At the second step — optimizer state exists by
then — staging is faulted in for the first save, in the background, by the front end in use
last (StepGate.newest), unless it was last used by a save outside any run (reserve_ahead):
steps it sees then may be another trainer's, and nothing would free what it reserved.
Layer-wise, a save's copies of the update's tensors are held until each DDP bucket is final
(write.layerwise).
During a run a removed file's blocks are freed off the training thread; nothing of this
outlives end_run().
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional

from .named import NamedCheckpoints
from .pending import Pending
from .write.gate import StepGate
from .write.layerwise import HeldSnapshots


class TrainingSaves:
    """named: where the checkpoints go; before_update: the plugin's own gate, called before
    every optimizer update (with the optimizer when scoped=True: it may wait only for what
    that step writes)."""

    def __init__(self, named: NamedCheckpoints, before_update: Callable[..., None], scoped: bool = False):
        self.named = named
        self._before_update = before_update
        self.gate = StepGate(self._gate, scoped=scoped)
        self.gate.install()
        self.held = HeldSnapshots(self.gate)
        self.active = False  # from the first save or update of a run to end_run()
        # off while the gate was armed again by a save outside any run (trainer.save_checkpoint
        # after fit): see the module's docstring
        self.reserve_ahead = True
        self.synchronous = False  # the caller saves off the training thread: nothing left behind
        self._freer: Optional[ThreadPoolExecutor] = None
        named.free = self._free

    @property
    def running(self) -> bool:
        """An optimizer step has run since the start (or the last end_run)."""
        return self.gate.steps_seen > 0

    def save(self, state: Any, path: str, step: int, held: bool = False,
             also_owned: frozenset = frozenset()) -> Pending:
        """One checkpoint of `state` at `path`. held: layer-wise, the update's own tensors are
        copied bucket by bucket as `held` releases them (not before any step, nor while the
        save must copy before returning). also_owned: storages that only the update writes
        beyond the optimizers' own."""
        self.active = self.active or self.running
        view = self.gate.snapshot_view(state, also_owned)
        held = held and self.running and not view.copy_now
        pending = self.named.save(view.state, path, step=step, held=held, watch=view.watch)
        if held and not pending.skipped:
            self.held.hold(pending, view.owned)
        if not self.running:
            pending.wait()
        elif view.copy_now:
            pending.release_all()
            pending.wait_copied()
        return pending

    def _gate(self, *optimizer) -> None:
        self.active = True
        self.held.clear()  # whatever a bucket did not release goes now
        self._before_update(*optimizer)
        if self.gate.steps_seen == 2 and self.reserve_ahead and self.gate.newest():
            self.named.reserve(self.gate.owned_bytes(), self.gate.owned_device())

    def _free(self, job: Callable[[], None]) -> None:
        """Frees a removed file's blocks: off the training thread during a run (joined at
        end_run), otherwise at once."""
        if not self.active or self.synchronous:
            job()
            return
        if self._freer is None:
            self._freer = ThreadPoolExecutor(1, thread_name_prefix="fastckpt-remove")
        self._freer.submit(job)

    def end_run(self) -> None:
        """No optimizer step of anyone reaches these saves any more, frees in flight are done;
        a next run starts afresh."""
        self.held.clear()
        self.gate.remove()
        self.gate.steps_seen = 0
        self.gate.trust.reset()
        self.active = False
        freer, self._freer = self._freer, None
        if freer is not None:
            freer.shutdown(wait=True)
