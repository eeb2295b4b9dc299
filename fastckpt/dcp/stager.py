"""FastStager: DCP's AsyncStager over the Checkpointer's write path — an async_save's snapshot
handed on to its FastStorageWriter, whose save copies it as any fastckpt save does, and kept
whole by the gate until then.

`writer = FastStorageWriter(...); dcp.async_save(state, storage_writer=writer, async_stager=FastStager(..., writer=writer))`:
`stage()` returns a future of the snapshot, resolved at once; DCP's save thread plans with it, and
the writer's save (a Checkpointer save through fastckpt.named) copies this rank's planned items
with the stager's strategy: 'c' through the writer's staging, chunk by chunk while its first
chunks are written; 'g' into spare memory first; 'd' written straight from the tensors. What
happens between:

- What is copied at stage() is what the write path says for every fastckpt front end
  (write.gate.StepGate.snapshot_view): tensors no optimizer owns (buffers the next forward pass
  changes) are copied now, the optimizers' own are handed on live, watched for in-place writes.
  Before any optimizer step, and until the run has earned trust (write.watch.Trust), the
  snapshot is copied whole instead (below).
- The gate. The optimizer step waits until the writer's save has copied the live tensors (with
  'd': written them; write.gate.StepGate, as every fastckpt front end). A tensor written in place
  by anything else before that is a torn snapshot: the writer fails that save
  (TornSnapshotError) and commits nothing.
- Slots. At most `concurrency` snapshots are staged or being written at a time, each in a slot
  drawn from fastckpt.write.concurrency (as a Checkpointer's checkpoints are). A stage() that
  finds every slot taken waits for one (policy='wait'), or raises
  SaveSkipped (policy='skip'); whether every rank has a slot is agreed, so a save skipped, or
  refused after that wait, is so on every rank. `staging_mb` bounds the slots as well.
- Waits. Every wait here (a slot, an earlier save, the gate, close) is the write path's
  (write.deadline.Deadline, as the Checkpointer's): it lasts as long as the writer's saves move,
  and gives up after stall_timeout_s + commit_timeout_s with nothing moved (without a writer,
  whose saves this stager cannot see move: after that long). A slot is waited for in rounds of
  that length, the ranks agreeing after each whether to wait on.
- A whole copy. A snapshot staged before trust, while an earlier one is still being saved on
  any rank (its save's turn to copy comes only after the earlier one is written), or with no
  FastStorageWriter to hand it to, is copied before stage() returns (fastckpt.dcp.staged, into
  memory of its own each time): training waits for that copy, not for the earlier save. Whether every rank's copy succeeded is agreed before stage() returns, so a
  failure fails that save on every rank, before DCP's collectives.
- Order. DCP runs each async_save on a thread of its own; two saves' collectives on one
  process group must not interleave. A save's thread, taking its snapshot (the future's
  result()), first waits until every earlier save of this stager is finished.

A slot is free again once its snapshot is no longer referenced (DCP drops it when the save ends)
or the thread that took it has ended (a failed save whose traceback still holds it); it is given
back when the next stage() looks. With a plain
`dcp.save`, pass the snapshot on without keeping it: `dcp.save(stager.stage(sd).result(), ...)`.
Construct a FastStager on every rank (it makes gloo groups when torch.distributed is up); call
close() at the end.
"""
from __future__ import annotations

import copy
import logging
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

import torch
from torch.distributed.checkpoint.staging import AsyncStager
import torch.utils._pytree as pytree  # torch 2.13 has no public pytree module; DCP itself uses this one

from ..commit.agreement import Agreement, make_agreement
from ..settings import CheckpointerConfig, given_one_way
from ..errors import CheckpointWriteError, ConfigError
from ..write.gate import SnapshotView, StepGate, storage_key
from ..write.concurrency import ConcurrencySlots, limit_for
from ..write.deadline import Deadline, WriteStalled
from . import staged as st
from .slots import SaveSkipped, Slot, StagedFuture

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import STATE_DICT_TYPE

    from .writer import FastStorageWriter

log = logging.getLogger("fastckpt")
IMMUTABLE = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device, torch.Size)


class FastStager(AsyncStager):
    """Args:
        writer: the FastStorageWriter that writes this stager's snapshots. Given, it copies the
            optimizer's tensors handed on live, with this stager's strategy, and refuses a
            snapshot written in place before it copied or wrote it (required with 'd'); without
            it, every snapshot is copied whole at stage() and any StorageWriter writes it as a
            plain state dict.
        settings: the Checkpointer's settings (or keywords): strategy ('c', 'g', 'd'),
            concurrency (snapshots staged or being written at once), policy ('wait', 'skip'),
            staging_mb (the slots' memory, None: concurrency snapshots' worth), stall_timeout_s
            and commit_timeout_s (how long a wait goes with nothing moved: their sum) are used;
            the others are the writer's and are only checked here.
    """

    _synchronize_after_execute = False  # stage() returns a future; the gate protects the state

    def __init__(self, settings: CheckpointerConfig | Mapping[str, Any] | None = None, *,
                 writer: Optional[FastStorageWriter] = None, **kwargs: Any) -> None:
        given = given_one_way(settings, kwargs)
        config = given if isinstance(given, CheckpointerConfig) else CheckpointerConfig.from_dict(given)
        if config.strategy == "d" and writer is None:
            raise ConfigError("FastStager(strategy='d') stages nothing, the snapshot is the live tensors: pass "
                              "writer=your FastStorageWriter, so that it can refuse a snapshot written in place")
        self.config = config
        self.strategy, self.concurrency, self.policy = config.strategy, config.concurrency, config.policy
        # every wait's: a slot's, an earlier save's, the gate's (its writer's saves moving: not stalled)
        self._deadline = Deadline(config.stall_timeout_s, _progress_of(writer))
        self._slack = config.commit_timeout_s  # the saves' collectives wait for other ranks too
        self._hands_on = writer is not None
        # handed_on: snapshots whose optimizer tensors went to the writer live; copied_by_writer: of
        # those, the ones whose copy the writer reported done (the gate let the step go then);
        # copied_whole: snapshots copied at stage(); copied_now: tensors copied at stage()
        self.stats = {"staged": 0, "copied_now": 0, "copied_whole": 0, "handed_on": 0, "copied_by_writer": 0,
                      "skipped": 0, "failed": 0}
        # twice the wait: a rank that waited in vain for a slot still meets the others
        self._agree: Agreement = make_agreement(2 * (config.stall_timeout_s + self._slack))
        # at most `concurrency` snapshots at once, as the Checkpointer's checkpoints (write.concurrency);
        # a slot is given back once its save is done with it, which is polled: a save thread's end
        # and the last reference to a snapshot going notify nobody
        self._slots: ConcurrencySlots[Slot] = ConcurrencySlots(config.concurrency,
                                                                lambda i: Slot(i, config.strategy),
                                                                reclaim=self._reclaim)
        self._cond = self._slots.changed  # also guards the slots' fields
        # only the staged-tensor counts: weakref callbacks run anywhere, also in a garbage collection
        # that runs while this thread holds it
        self._count_lock = threading.RLock()
        self._seq = 0
        self._gate = StepGate(self._before_update)
        self._gate.install()
        self._closed = False
        if writer is not None:
            writer.meet(self)

    def __repr__(self) -> str:
        return (f"FastStager(strategy={self.strategy!r}, concurrency={self.concurrency}, "
                f"policy={self.policy!r}, {sum(s.busy for s in self._slots.every())} in flight)")

    # -- DCP's calls ----------------------------------------------------------
    def stage(self, state_dict: STATE_DICT_TYPE, **kwargs: Any) -> StagedFuture:
        """Takes a slot, copies what must be copied now, hands the rest on live; returns a future
        of the snapshot, resolved (see the module docstring)."""
        if self._closed:
            raise RuntimeError("this FastStager is closed")
        leaves = pytree.tree_leaves(state_dict)
        if any(st.sharded_tensor(leaf) for leaf in leaves):
            raise TypeError("FastStager stages torch.Tensor and DTensor values; a ShardedTensor "
                            "(FSDP1's sharded state dict) is not supported: use FSDP2 (fully_shard) "
                            "or DCP's DefaultStager")
        slot = self._take_slot(self._bytes_of(leaves))
        del leaves
        seq, self._seq = self._seq, self._seq + 1
        with self._cond, self._count_lock:
            slot.begin(seq, threading.current_thread())
        self.stats["staged"] += 1
        error: Optional[BaseException] = None
        snapshot = None
        try:
            with self._cond:  # the snapshots whose saves are done give their slots back first
                self._reclaim()
                earlier = any(s is not slot and s.busy for s in self._slots.every())
            # on every rank alike: a rank that hands on live must not wait, through DCP's collectives,
            # for another rank's earlier save
            alone = self._agree.all_ok(not earlier)
            view = None
            if self._hands_on and alone and self._gate.steps_seen > 0:
                view = self._gate.snapshot_view(state_dict)  # watched, also when copied whole: trust is earned so
            if view is not None and not view.copy_now:
                snapshot = self._handed_on(slot, view)
            else:
                snapshot = self._copied_whole(slot, state_dict)
        except BaseException as e:  # noqa: BLE001 - agreed below, raised on every rank
            error = e
        everyone = False
        try:
            everyone = self._agree.all_ok(error is None)
        finally:
            with self._cond:
                slot.staging = False
                if not everyone:
                    slot.end()
                    self._slots.give_back(slot)
                self._cond.notify_all()
        if not everyone:
            self.stats["failed"] += 1
            del snapshot
            raise error or CheckpointWriteError(
                "another rank could not stage its part of this checkpoint; it is not saved "
                "(the training state itself is intact)")
        return StagedFuture(self, slot, seq, snapshot)

    def snapshot_of(self, t: torch.Tensor) -> Optional[Slot]:
        """The slot whose snapshot, staged now, holds this tensor's memory (None: not one of
        this stager's): what the writer it was given asks of each tensor it writes."""
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return None
        address = st.local_tensor(t).untyped_storage().data_ptr()
        holders = [s for s in self._slots.every() if s.holds(address)]
        # a snapshot is handed on live only when no earlier one is in flight, but one may finish
        # just then: the one this save's thread took (DCP writes on the thread that took the
        # snapshot), else the one still in use
        me = threading.current_thread()
        return next((s for s in holders if s.taken_by is me), None) or \
            next((s for s in holders if not s.finished()), None)

    def taken_by(self, thread: threading.Thread) -> Optional[Slot]:
        """The slot whose snapshot that save thread took (None: none of this stager's): the writer
        credits its copy to it though DCP planned none of its live tensors on this rank (a
        replicated tensor another rank writes)."""
        with self._cond:
            return next((s for s in self._slots.every() if s.busy and s.taken_by is thread), None)

    @property
    def hands_on_live(self) -> bool:
        """Whether, once trusted, this stager hands the optimizer's host tensors to its writer
        live with 'c': that writer's own staging will copy them."""
        return self._hands_on and self.strategy == "c"

    def writer_copied(self, slot: Slot, seq: int) -> None:
        """The writer's save has copied the live tensors of snapshot `seq` (staged in `slot`): whether
        one was written in place before is decided now, while the gate still holds the optimizer
        step (else the gate's own settle decides it, before the step), and the gate lets it go."""
        if not any(s is slot for s in self._slots.every()):
            return  # another stager's
        with self._cond:
            if not (slot.busy and slot.seq == seq and slot.live) or slot.copied_by_writer:
                return  # that snapshot is gone (its slot taken again), or was credited already
            slot.torn()
            slot.copied_by_writer = True
            self.stats["copied_by_writer"] += 1
            self._cond.notify_all()

    def synchronize_staging(self) -> None:
        """Waits until no save reads the caller's tensors any more (what the gate waits for)."""
        self._before_update()

    def close(self) -> None:
        """Waits, while they move, for the saves in flight to be done with their snapshots, and
        stops the stager's gate."""
        if self._closed:
            return
        self._closed = True
        self._gate.remove()
        try:
            self._wait_until("the saves in flight to be done with their snapshots",
                             lambda: all(s.finished() for s in self._slots.every()))
        except CheckpointWriteError:
            log.warning("fastckpt: FastStager closed while a save still holds its snapshot")
        self._slots.forget_all()
        self._agree.close()

    # -- the snapshot ---------------------------------------------------------
    def _handed_on(self, slot: Slot, view: SnapshotView) -> Any:
        """The snapshot as the write path's view of the state (the optimizers' tensors left live,
        watched; the rest copied now), its live tensors as new objects (the slot is free once
        they are gone). CUDA events mark what the training thread had queued: the writer reads
        the tensors on its own thread, after them (Slot.order_after_stage)."""
        def tensor(leaf: torch.Tensor) -> torch.Tensor:
            key = storage_key(leaf)
            if key in view.owned:
                slot.live.add(key)
                return leaf.detach()
            slot.copies.add(key)  # copied now (freeze_unowned)
            self.stats["copied_now"] += 1
            return leaf

        snapshot, cuda = self._snapshot(slot, view.state, tensor)
        slot.watch = view.watch
        for device in cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            slot.after.append((device, event))
        self.stats["handed_on"] += 1
        return snapshot

    def _copied_whole(self, slot: Slot, state_dict: STATE_DICT_TYPE) -> Any:
        """The snapshot as a copy of every tensor, made now (fastckpt.dcp.staged)."""
        def tensor(leaf: torch.Tensor) -> torch.Tensor:
            staged = st.copy_of(leaf, self.strategy, direct_io=self._hands_on)
            slot.copies.add(storage_key(staged))
            return staged

        snapshot, cuda = self._snapshot(slot, state_dict, tensor)
        for device in cuda:
            torch.cuda.current_stream(device).synchronize()
        self.stats["copied_whole"] += 1
        self.stats["copied_now"] += slot.tensors
        return snapshot

    def _snapshot(self, slot: Slot, state: Any,
                  tensor: Callable[[torch.Tensor], torch.Tensor]) -> tuple[Any, set[torch.device]]:
        """(state with each tensor leaf replaced by tensor(leaf), counted in the slot, and every
        other mutable leaf deep-copied; the CUDA devices of its tensors)."""
        leaves, spec = pytree.tree_flatten(state)
        cuda: set[torch.device] = set()
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor):
                device = st.local_tensor(leaf).device
                if device.type == "cuda":
                    cuda.add(device)
                leaves[i] = self._track(slot, tensor(leaf))
            elif not isinstance(leaf, IMMUTABLE):
                leaves[i] = copy.deepcopy(leaf)
        return pytree.tree_unflatten(leaves, spec), cuda

    def _track(self, slot: Slot, t: torch.Tensor) -> torch.Tensor:
        with self._count_lock:
            slot.alive += 1
            slot.tensors += 1
            def gone(_r: weakref.ReferenceType[torch.Tensor], s: Slot = slot, seq: int = slot.seq) -> None:
                self._gone(s, seq)
            slot.refs.append(weakref.ref(t, gone))
        return t

    def _gone(self, slot: Slot, seq: int) -> None:
        """A staged tensor of snapshot `seq` is gone (an older snapshot's counts for nothing).
        Runs wherever the last reference went (the garbage collector included): it takes no lock
        but the counts' own, and notifies nobody."""
        with self._count_lock:
            if slot.seq == seq:
                slot.alive -= 1

    # -- slots ----------------------------------------------------------------
    def _bytes_of(self, leaves: list[Any]) -> int:
        """A snapshot's bytes (a whole copy's, also with 'd': staged beside an earlier save)."""
        return sum(st.local_tensor(t).nbytes for t in leaves if isinstance(t, torch.Tensor))

    def _reclaim(self) -> None:
        """Gives back the slots whose saves are done with their snapshots (the slots' condition held)."""
        for s in self._slots.taken():
            if s.busy and s.finished():
                s.end()
                self._slots.give_back(s)

    def _take_slot(self, nbytes: int) -> Slot:
        """A free slot on every rank, or on none. With 'wait', in rounds of at most stall_timeout_s +
        commit_timeout_s: after each, the ranks agree whether every rank has one and, when not,
        whether the saves any rank waited for moved meanwhile (then another round). A rank that
        found none never leaves the others to start the save's collectives without it, and none
        waits in the agreement for longer than one round."""
        limit = limit_for(self.concurrency, self.config.staging_mb, nbytes)
        round_s = self._deadline.stall_s + self._slack
        slot: Optional[Slot] = None
        while True:
            moved = False
            if self.policy == "skip":
                slot = self._slots.take(limit=limit)
            else:
                seen = self._deadline.seen()
                slot = self._slots.take(lambda attempt: self._waited("a free staging slot", attempt, round_s),
                                        limit=limit)
                moved = slot is None and self._deadline.seen() != seen
            answer = [0, 0]

            def every_rank(has: bool) -> bool:
                answer[:] = self._agree.all_min([int(has), int(not moved)])
                return answer[0] == 1

            if self._slots.kept_if_every_rank_has_one(slot, slot is not None, every_rank):
                assert slot is not None  # every rank had one, this one too
                return slot
            if self.policy == "skip":
                self.stats["skipped"] += 1
                raise SaveSkipped(f"{self.concurrency} checkpoint(s) in flight on some rank (policy='skip'): "
                                  "this async_save was skipped on every rank")
            if answer[1] == 1:  # nothing any rank waited for moved
                raise CheckpointWriteError(
                    f"no staging slot became free on {'this rank' if slot is None else 'another rank'}, nothing "
                    f"moved for {round_s:g} s ({self.concurrency} saves in flight); this async_save was refused "
                    "on every rank. Is an earlier async_save stuck, or its staged state still referenced?")

    def _taken(self, slot: Slot, seq: int) -> bool:
        """The future's result() is taken. On a save thread (not the one that staged): remember
        it, wait until every earlier save is finished, and return True (the snapshot is handed
        over)."""
        me = threading.current_thread()
        with self._cond:
            if me is slot.staged_by and slot.seq == seq:
                slot.taken_here = True
            if slot.seq != seq or slot.taken_by is not None or me is slot.staged_by:
                return False
            slot.taken_by = me
        self._wait_until("an earlier async_save to finish", lambda: not any(
            s.busy and s.seq < seq and not s.finished() for s in self._slots.every()))
        return True

    # -- the gate -------------------------------------------------------------
    def _before_update(self) -> None:
        """Before every optimizer step: the writer's saves have copied the live tensors (with 'd':
        written them), or are over."""
        self._wait_until("the writer's copy of a snapshot",
                         lambda: not any(s.waits_for_writer for s in self._slots.every()))

    def _waited(self, what: str, attempt: Callable[[float], bool], timeout: Optional[float] = None) -> bool:
        """attempt(seconds) in short slices (a slot or a snapshot freed notifies nobody) until it
        returns True, under the write path's deadline: False once `timeout` passed, or once nothing
        moved for stall_timeout_s + commit_timeout_s."""
        try:
            return self._deadline.wait(what, lambda s: attempt(min(s, 0.05)), timeout=timeout, slack=self._slack)
        except WriteStalled:
            return False

    def _wait_until(self, what: str, done: Callable[[], bool]) -> None:
        """Until done() holds (read under the slots' condition); CheckpointWriteError once nothing
        moved for stall_timeout_s + commit_timeout_s."""
        def attempt(seconds: float) -> bool:
            with self._cond:
                return self._cond.wait_for(done, seconds)
        if not attempt(0.0) and not self._waited(what, attempt):  # at once, most often (the gate)
            raise CheckpointWriteError(
                f"FastStager waited for {what}, and nothing moved for {self._deadline.stall_s + self._slack:g} s "
                f"(stall_timeout_s={self._deadline.stall_s:g} + commit_timeout_s={self._slack:g})")


def _progress_of(writer: Optional[FastStorageWriter]) -> Callable[[], int]:
    """The writer's progress counter, held weakly (a stager does not keep its writer alive); 0
    without one."""
    ref = weakref.ref(writer) if writer is not None else None

    def progress() -> int:
        w = ref() if ref is not None else None
        return w.progress() if w is not None else 0
    return progress
