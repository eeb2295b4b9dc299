"""FastStager: DCP's AsyncStager — an async_save's snapshot taken off the training thread, into
bounded staging reused from save to save, kept whole by the gate before the optimizer step.

`writer = FastStorageWriter(...); dcp.async_save(state, storage_writer=writer, async_stager=FastStager(..., writer=writer))`:
`stage()` returns at once with a future of the staged state dict; DCP's save thread waits for
it and writes what it holds. What happens between:

- Slots. At most `concurrency` snapshots are staged or being written at a time, each in a slot
  (drawn from fastckpt.write.concurrency, as a Checkpointer's checkpoints are) of its own
  buffers (fastckpt.write.snapshot_buffers), reused by the slot's next snapshot. A stage() that finds every
  slot taken waits for one (policy='wait', up to commit_timeout_s), or raises SaveSkipped
  (policy='skip'); whether every rank has a slot is agreed, so a save skipped, or refused after
  that wait, is so on every rank. `staging_mb` bounds the slots' memory as well.
- The copy. As a TrainingSession (fastckpt.session) saves: before any optimizer step has run,
  and until the run has shown that nothing but the optimizer writes the saved tensors between a
  save and the next step (write.watch.Trust), stage() copies everything before it returns. Then, tensors no
  optimizer owns (buffers that the next forward pass changes) are copied at once and the
  optimizers' own are copied on the stager's thread, while training goes on. Strategy 'c':
  into host buffers (page-locked for CUDA tensors; O_DIRECT-ready) — but with its
  FastStorageWriter and a host state, the optimizers' own are not copied here at all: they are
  handed on live, and the writer's save copies them as a Checkpointer's 'c' save does (chunk
  by chunk, its first chunks written while it copies the rest: one copy, and the disk busy
  from the start); 'g': a CUDA tensor into spare memory of its device; 'd': not copied, the
  snapshot is the live tensors.
- The gate. The optimizer step waits for the copies still running (write.gate.StepGate, as
  every fastckpt front end): the writer's copy of tensors handed on live, and with 'd', until
  the snapshot is written. A tensor written in place
  by anything else before its copy is a torn snapshot: that save fails (TornSnapshotError).
- Agreement. Whether a snapshot came out whole is agreed on every rank (commit.agreement,
  on the stager's own groups) before its future resolves, so a failure fails every rank's
  save before DCP's collectives: no rank waits for one that gave up.
- Order. DCP runs each async_save on a thread of its own; two saves' collectives on one
  process group must not interleave. A save's thread, taking its snapshot (the future's
  result()), first waits until every earlier save of this stager is finished, so saves are
  written one after another while the next ones are already staged.

A slot is free again once its snapshot is no longer referenced (DCP drops it when the save
ends) or the thread that took it has ended (a failed save whose traceback still holds it: its
buffers are then left to the garbage collector and the slot gets new ones), and the stager's
own thread has returned from delivering it (stage() waits for that, briefly, before it judges
the slots: a snapshot just dropped is not a save in flight). With a plain
`dcp.save`, pass the snapshot on without keeping it: `dcp.save(stager.stage(sd).result(), ...)`.
Construct a FastStager on every rank (it makes gloo groups when torch.distributed is up); call
close() at the end.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Mapping, Optional

import torch
from torch.distributed.checkpoint.staging import AsyncStager
import torch.utils._pytree as pytree  # torch 2.13 has no public pytree module; DCP itself uses this one

from ..commit.agreement import Agreement, make_agreement
from ..settings import CheckpointerConfig, given_one_way
from ..errors import CheckpointWriteError, ConfigError, TornSnapshotError
from ..write.gate import StepGate, storage_key
from ..write.concurrency import ConcurrencySlots, limit_for, wait_for
from ..write.snapshot_buffers import SnapshotBuffers
from . import staged as st
from .slots import SaveSkipped, Slot, SlotState, StagedFuture

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import STATE_DICT_TYPE

    from ..write.watch import SnapshotWatch
    from .writer import FastStorageWriter

log = logging.getLogger("fastckpt")
IMMUTABLE = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device, torch.Size)


class FastStager(AsyncStager):
    """Args:
        writer: the FastStorageWriter that writes this stager's snapshots. Given, it writes a
            staged snapshot straight from its buffers (no second copy), copies the optimizer's
            tensors itself with 'c' on a host state (handed on live, once the run earned trust),
            and refuses a snapshot written in place before it copied or wrote it (required with
            'd'); without it, any StorageWriter writes the snapshot as a plain state dict.
        settings: the Checkpointer's settings (or keywords): strategy ('c', 'g', 'd'),
            concurrency (snapshots staged or being written at once), policy ('wait', 'skip'),
            staging_mb (the slots' memory, None: concurrency snapshots' worth) and
            commit_timeout_s (the longest wait for a slot or an earlier save) are used; the
            others are the writer's and are only checked here.
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
        self.timeout_s = config.commit_timeout_s
        # 'c' with a FastStorageWriter on a host state: the optimizers' tensors are handed on live
        # and copied by the writer's save (see stage)
        self._copied_by_writer = writer is not None and config.strategy == "c"
        self._written_from_buffers = writer is not None and not self._copied_by_writer
        # handed_on: snapshots whose optimizer tensors went to the writer live; copied_by_writer: of
        # those, the ones whose copy the writer reported done (the gate let the step go then)
        self.stats = {"staged": 0, "copied_now": 0, "copied_later": 0, "skipped": 0, "failed": 0,
                      "handed_on": 0, "copied_by_writer": 0}
        # twice the wait: a rank that waited commit_timeout_s for a slot still meets the others
        self._agree: Agreement = make_agreement(2 * self.timeout_s)
        # at most `concurrency` snapshots at once, as the Checkpointer's checkpoints (write.concurrency);
        # a slot is given back once its save is done with it, which is polled: a save thread's end
        # and the last reference to a snapshot going notify nobody
        self._slots: ConcurrencySlots[Slot] = ConcurrencySlots(config.concurrency,
                                                                lambda i: Slot(self._new_buffers(), i),
                                                                reclaim=self._reclaim)
        self._cond = self._slots.changed  # also guards the slots' states
        self._count_lock = threading.Lock()  # only the staged-tensor counts: weakref callbacks run anywhere
        self._seq = 0
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fastckpt-dcp-stage")
        self._own_thread: Optional[threading.Thread] = None  # the worker's one thread, once it ran
        self._stream: Optional[torch.cuda.Stream] = None
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
        """Takes a slot, copies what must be copied now, leaves the rest to the stager's thread;
        returns a future of the staged state dict (see the module docstring)."""
        if self._closed:
            raise RuntimeError("this FastStager is closed")
        with_paths, spec = pytree.tree_flatten_with_path(state_dict)
        leaves = [leaf for _, leaf in with_paths]
        names = [pytree.keystr(path) for path, _ in with_paths]
        for leaf in leaves:
            if st.sharded_tensor(leaf):
                raise TypeError("FastStager stages torch.Tensor and DTensor values; a ShardedTensor "
                                "(FSDP1's sharded state dict) is not supported: use FSDP2 (fully_shard) "
                                "or DCP's DefaultStager")
        slot = self._take_slot(self._bytes_of(leaves))
        seq, self._seq = self._seq, self._seq + 1
        future = StagedFuture(self, slot, seq)
        with self._count_lock:
            slot.seq, slot.alive, slot.refs = seq, 0, []
        slot.error, slot.tensors, slot.taken_here = None, 0, False
        slot.writer_copies = slot.copied_by_writer = False
        slot.staged_by, slot.taken_by = threading.current_thread(), None
        self.stats["staged"] += 1
        later: list[int] = []
        staged: list[Any] = list(leaves)
        event = now_done = None
        slot.tensors = sum(isinstance(leaf, torch.Tensor) for leaf in leaves)
        device = _cuda_device(leaves)
        try:
            later, slot.watch = self._split(leaves, names)
            now = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor) and i not in later]
            for i in now:
                staged[i] = self._stage_leaf(slot, i, leaves[i], stream=None)
            for i, leaf in enumerate(leaves):
                if not isinstance(leaf, torch.Tensor) and not isinstance(leaf, IMMUTABLE):
                    staged[i] = copy.deepcopy(leaf)
            self.stats["copied_now"] += len(now)
            self.stats["copied_later"] += len(later) if self.strategy != "d" else 0
            if self.strategy == "d" or (later and self._copied_by_writer and device is None):
                # 'd': the snapshot is the live tensors until written. 'c' on the host with its
                # FastStorageWriter: the writer's own save copies them (chunk by chunk, while its
                # first chunks are already being written), and the gate holds the optimizer step
                # until that copy is done (writer_copied): one copy, and the disk busy sooner
                for i in later:
                    staged[i] = self._live_leaf(slot, leaves[i])
                slot.writer_copies = self.strategy == "c" and bool(later)
                self.stats["handed_on"] += slot.writer_copies
                later = []
            event = self._after_current_stream(leaves, later)
            now_done = _event_after(now, leaves)  # a CUDA copy made now ('g': device to device) is queued
        except Exception as e:  # noqa: BLE001 - agreed below, raised by every rank's save
            slot.error = e
            later = []
        if not later:
            slot.to(SlotState.COPIED)
        slot.unwinding = True
        # one list the stager's thread empties: the executor's own record of the call holds nothing of
        # the snapshot once _finish has returned (see _unwound)
        job = [slot, future, leaves, staged, later, spec, event, now_done, device]
        def unwound(_done: concurrent.futures.Future[None], s: Slot = slot) -> None:
            self._unwound(s)
        self._worker.submit(self._finish, job).add_done_callback(unwound)
        return future

    def snapshot_of(self, t: torch.Tensor) -> Optional[Slot]:
        """The slot whose snapshot, staged now, holds this tensor's memory (None: not one of
        this stager's): what the writer it was given asks of each tensor it writes."""
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return None
        address = st.local_tensor(t).untyped_storage().data_ptr()
        holders = [s for s in self._slots.every() if s.holds(address)]
        # snapshots handed on live hold the same tensors: the one this save's thread took (DCP writes
        # on the thread that took the snapshot), else one still in use (a finished one stays busy
        # until its slot is taken again)
        me = threading.current_thread()
        return next((s for s in holders if s.taken_by is me), None) or \
            next((s for s in holders if not s.finished()), None) or (holders[0] if holders else None)

    def _new_buffers(self) -> SnapshotBuffers:
        """A slot's buffers: in memory O_DIRECT moves fastest where the writer writes every staged
        snapshot from them ('g' given its writer); else plain memory, faulted in sooner (with 'c'
        given its writer they are written from only until the run has earned trust)."""
        return SnapshotBuffers(device_copy=self.strategy == "g", direct_io=self._written_from_buffers)

    @property
    def hands_on_live(self) -> bool:
        """Whether, once trusted, this stager hands the optimizer's host tensors to its writer live
        (strategy 'c' with its FastStorageWriter): that writer's own staging will copy them."""
        return self._copied_by_writer

    def writer_copied(self, slot: Slot, seq: int) -> None:
        """The writer's save has copied the live tensors of snapshot `seq` (staged in `slot`): whether
        one was written in place before is decided now, while the gate still holds the optimizer
        step (else the gate's own settle decides it, before the step), and the gate lets it go."""
        if not any(s is slot for s in self._slots.every()):
            return  # another stager's
        with self._cond:
            if not (slot.busy and slot.seq == seq and slot.writer_copies) or slot.copied_by_writer:
                return  # that snapshot is gone (its slot taken again), or was credited already
            slot.torn()
            slot.copied_by_writer = True
            self.stats["copied_by_writer"] += 1
            self._cond.notify_all()

    def synchronize_staging(self) -> None:
        """Waits until no copy reads the caller's tensors (what the gate waits for)."""
        self._before_update()

    def close(self) -> None:
        """Waits (bounded) for the saves in flight to be done with their snapshots, stops the
        stager's thread and gate, and frees the buffers."""
        if self._closed:
            return
        self._closed = True
        self._gate.remove()
        self._worker.shutdown(wait=True)
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while not all(s.finished() for s in self._slots.every()) and time.monotonic() < deadline:
                self._cond.wait(0.05)  # a save thread's end is polled: it notifies nobody
            for s in self._slots.every():
                if s.finished():
                    self._release(s)
                    s.buffers.free()
                else:  # still written after the deadline: its buffers stay with that save
                    log.warning("fastckpt: FastStager closed while a save still holds its snapshot")
                    s.buffers.forget()
            self._slots.forget_all()
        self._agree.close()

    # -- the copy -------------------------------------------------------------
    def _split(self, leaves: list[Any], names: list[str]) -> tuple[list[int], Optional[SnapshotWatch]]:
        """(leaves copied after stage() returns, the watch over their versions): the optimizers'
        own tensors, once steps run and the run has earned it; every other tensor is copied now."""
        if self._gate.steps_seen == 0:
            return [], None
        owned = self._gate.owned_storages()
        later = [i for i, leaf in enumerate(leaves)
                 if isinstance(leaf, torch.Tensor) and storage_key(leaf) in owned]
        watch = self._gate.trust.watch([(names[i], leaves[i]) for i in later])
        return (later, watch) if watch.deferred else ([], watch)

    def _stage_leaf(self, slot: Slot, i: int, leaf: torch.Tensor, stream: Optional[torch.cuda.Stream]) -> torch.Tensor:
        buf = slot.buffers.for_leaf(i, st.local_tensor(leaf))
        st.copy_leaf(leaf, buf, stream)
        return self._track(slot, st.staged_like(leaf, buf))

    def _live_leaf(self, slot: Slot, leaf: torch.Tensor) -> torch.Tensor:
        """Strategy 'd': the snapshot is the caller's tensor (a new object over its memory)."""
        slot.live.append(storage_key(leaf))
        return self._track(slot, leaf.detach())

    def _track(self, slot: Slot, t: torch.Tensor) -> torch.Tensor:
        with self._count_lock:
            slot.alive += 1
            def gone(_r: weakref.ReferenceType[torch.Tensor], s: Slot = slot, seq: int = slot.seq) -> None:
                self._gone(s, seq)
            slot.refs.append(weakref.ref(t, gone))
        return t

    def _gone(self, slot: Slot, seq: int) -> None:
        """A staged tensor of snapshot `seq` is gone (an older snapshot's, left to the garbage
        collector, counts for nothing). Runs wherever the last reference went (the garbage
        collector included): it takes no lock but the counts' own, and notifies nobody."""
        with self._count_lock:
            if slot.seq == seq:
                slot.alive -= 1

    def _after_current_stream(self, leaves: list[Any], later: list[int]) -> Optional[torch.cuda.Event]:
        """A CUDA event after the work queued so far on the current stream: the stager's own
        stream starts the late copies after it (the training thread may queue more meanwhile)."""
        if not later or not any(leaves[i].device.type == "cuda" for i in later):
            return None
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        event = torch.cuda.Event()
        event.record()
        return event

    def _finish(self, job: list[Any]) -> None:
        """On the stager's thread: the late copies, the check that the snapshot is whole, the
        agreement across ranks, then the future — which is resolved whatever happens here.
        job: what stage() hands over, emptied here, so that nothing of the snapshot outlives this
        call on this thread."""
        slot, future, leaves, staged, later, spec, event, now_done, device = job
        job.clear()
        self._own_thread = threading.current_thread()
        try:
            with (torch.cuda.device(device) if device is not None else contextlib.nullcontext()):
                self._copy_late(slot, leaves, staged, later, event, now_done)
        finally:
            try:
                self._deliver(slot, future, staged, spec)
            except BaseException as e:  # noqa: BLE001 - the agreement itself failed (a peer gone)
                error = e
                with self._cond:
                    slot.to(SlotState.DELIVERED)
                    self._cond.notify_all()
                self.stats["failed"] += 1
                future.set_exception(error)

    def _copy_late(self, slot: Slot, leaves: list[Any], staged: list[Any], later: list[int],
                   event: Optional[torch.cuda.Event], now_done: Optional[torch.cuda.Event]) -> None:
        try:
            if now_done is not None:
                now_done.synchronize()
            if slot.error is None and later:
                if event is not None:
                    assert self._stream is not None  # made with the event (_after_current_stream)
                    self._stream.wait_event(event)
                for i in later:
                    staged[i] = self._stage_leaf(slot, i, leaves[i], self._stream)
                if self._stream is not None:
                    self._stream.synchronize()
                torn = slot.torn()
                if torn:
                    raise TornSnapshotError(
                        f"{torn} was written in place after async_save() and before its snapshot was copied; "
                        "this checkpoint is not saved (the training state itself is intact)")
        except Exception as e:  # noqa: BLE001 - agreed and raised by the save
            slot.error = e
        finally:
            slot.to(SlotState.COPIED)
            leaves.clear()  # the caller's tensors are let go here
            with self._cond:
                self._cond.notify_all()

    def _deliver(self, slot: Slot, future: StagedFuture, staged: list[Any], spec: pytree.TreeSpec) -> None:
        error = slot.error  # read before the slot can be taken again
        ok = self._agree.all_ok(error is None, background=True)
        if ok:
            slot.buffers.keep_only(len(staged))
            result = pytree.tree_unflatten(staged, spec)
        else:
            self.stats["failed"] += 1
            staged.clear()
        with self._cond:
            slot.to(SlotState.DELIVERED)
            self._cond.notify_all()
        if ok:
            future.set_result([result])
        else:
            future.set_exception(error or CheckpointWriteError(
                "another rank could not stage its part of this checkpoint; it is not saved "
                "(the training state itself is intact)"))

    def _unwound(self, slot: Slot) -> None:
        """The stager's thread has returned from a snapshot's _finish: it holds nothing of it any more."""
        with self._cond:
            slot.unwinding = False
            self._cond.notify_all()

    def _let_go(self) -> None:
        """Until the stager's thread has returned from every snapshot it already delivered
        (bounded). Resolving a future is the last thing it does for a snapshot, but until it has
        returned its frames still hold that snapshot, so a slot whose caller is done with it would
        be judged in flight, and with policy 'skip' a save skipped for nothing. Not on that thread
        itself (a callback of a future it resolves, staging again)."""
        if threading.current_thread() is self._own_thread:
            return
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while (any(s.unwinding and s.delivered for s in self._slots.every())
                   and time.monotonic() < deadline):
                self._cond.wait(0.05)

    # -- slots ----------------------------------------------------------------
    def _bytes_of(self, leaves: list[Any]) -> int:
        if self.strategy == "d":
            return 0
        return sum(st.local_tensor(t).numel() * st.local_tensor(t).element_size()
                   for t in leaves if isinstance(t, torch.Tensor))

    def _reclaim(self) -> None:
        """Gives back the slots whose saves are done with their snapshots (the slots' condition held)."""
        for s in self._slots.taken():
            if s.busy and s.finished():
                self._release(s)

    def _release(self, s: Slot) -> None:
        """A slot whose save is done with it: FREE, and given back (the slots' condition held)."""
        if not s.busy:
            return
        if s.alive > 0:  # still referenced (a failed save's traceback): left to the garbage collector
            s.buffers.forget()
            s.buffers = self._new_buffers()
        if s.live:  # 'd' (or copied by the writer): the snapshot was the caller's tensors until now
            torn = s.torn()  # decided once: for a snapshot the writer copied, when its copy was done
            if torn and s.error is None:  # FastStorageWriter refused it already; another writer cannot
                log.error("fastckpt: %s was written in place while async_save() was saving it; "
                          "unless FastStorageWriter refused that save, it may mix two states", torn)
        s.to(SlotState.FREE)
        s.taken_by, s.staged_by, s.watch, s.live, s.refs = None, None, None, [], []
        s.writer_copies = s.copied_by_writer = False
        self._slots.give_back(s)

    def _take_slot(self, nbytes: int) -> Slot:
        """A free slot on every rank, or on none: whether each rank has one is agreed (with 'wait',
        after waiting up to commit_timeout_s for one), so a rank that found none never leaves the
        others to start the save's collectives without it."""
        self._let_go()
        slot = self._slots.take(wait_for(self.timeout_s) if self.policy == "wait" else None,
                                limit=limit_for(self.concurrency, self.config.staging_mb, nbytes))
        if slot is not None:
            with self._cond:
                slot.to(SlotState.STAGING)
        everyone = False
        try:
            everyone = self._agree.all_ok(slot is not None)
        finally:  # refused, or the agreement itself failed (a peer gone): the slot is given back
            if slot is not None and not everyone:
                with self._cond:
                    slot.to(SlotState.FREE)
                    self._slots.give_back(slot)
        if not everyone:
            if self.policy == "skip":
                self.stats["skipped"] += 1
                raise SaveSkipped(f"{self.concurrency} checkpoint(s) in flight on some rank (policy='skip'): "
                                  "this async_save was skipped on every rank")
            raise CheckpointWriteError(
                f"no staging slot became free in {self.timeout_s:.0f} s on "
                f"{'this rank' if slot is None else 'another rank'} ({self.concurrency} saves in flight); "
                "this async_save was refused on every rank. Is an earlier async_save stuck, or its "
                "staged state still referenced?")
        assert slot is not None  # every rank had one, this one too
        return slot

    def _taken(self, slot: Slot, seq: int) -> bool:
        """The future's result() is taken. On a save thread (not the one that staged, not the
        stager's): remember it, wait until every earlier save is finished, and return True
        (the snapshot is handed over)."""
        me = threading.current_thread()
        if me is self._own_thread:  # DCP's callback, run as the stager's thread resolves the future
            return False
        with self._cond:
            if me is slot.staged_by and slot.seq == seq:
                slot.taken_here = True
            if slot.seq != seq or slot.taken_by is not None or me is slot.staged_by:
                return False
            slot.taken_by = me
            deadline = time.monotonic() + self.timeout_s
            while any(s.busy and s.seq < seq and not s.finished() for s in self._slots.every()):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CheckpointWriteError(f"an earlier async_save did not finish in {self.timeout_s:.0f} s")
                self._cond.wait(min(left, 0.05))
        return True

    # -- the gate -------------------------------------------------------------
    def _before_update(self) -> None:
        """Before every optimizer step: the copies are done (with 'd': the snapshots are written; a
        snapshot the writer copies: its copy is done)."""
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            for s in self._slots.every():
                while s.busy and not (s.copied and (not s.live or s.copied_by_writer or s.finished())):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise CheckpointWriteError(f"a snapshot was not copied in {self.timeout_s:.0f} s")
                    self._cond.wait(min(left, 0.05))


def _cuda_device(leaves: list[Any]) -> Optional[int]:
    """The CUDA device of the training thread when the state holds CUDA tensors (the stager's
    thread copies and allocates for it there, not on device 0)."""
    if any(isinstance(t, torch.Tensor) and st.local_tensor(t).device.type == "cuda" for t in leaves):
        return torch.cuda.current_device()
    return None


def _event_after(now: list[int], leaves: list[Any]) -> Optional[torch.cuda.Event]:
    """An event after the copies made now, when one of them is a CUDA copy the current stream
    still runs ('g' copies into device memory asynchronously)."""
    if any(st.local_tensor(leaves[i]).device.type == "cuda" for i in now):
        event = torch.cuda.Event()
        event.record()
        return event
    return None
