"""Checkpointer: up to N concurrent, crash-consistent checkpoints under one root (PCcheck).

Owns the life of a checkpoint: save() plans the file, reserves a concurrency
slot and staging, issues the snapshot and returns; its commit (fastckpt.commit.checkpoint_unit,
through the ordered commit of fastckpt.commit.ordered) finishes the file, then — in counter
order, agreed by all ranks — writes the commit record, moves `latest` forward and applies retention.
Errors of background writes are raised by Pending.wait() and, if nobody looked, by the next
save() — on every rank alike, agreed in one collective (fastckpt.commit.agreed_errors) — wait()
or close(). Every wait of the write path is bounded by one Deadline (stall_timeout_s without
progress -> WriteStalled, see fastckpt.write).
What is in flight: fastckpt.commit.in_flight; reading back: fastckpt.restore.
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Mapping, Optional, cast

from .commit.agreed_errors import AgreedErrors
from .commit.agreement import Agreement, make_agreement
from .commit.checkpoint_unit import CheckpointCommit
from .commit.in_flight import InFlight
from .commit.ordered import OrderedCommits
from .commit.persisting import Persisting
from .commit_info import CommitInfo
from .settings import CheckpointerConfig, given_one_way, with_root
from .errors import CheckpointWriteError
from .format import plan_file
from .format.fitting import Destination
from .format.plan import FilePlan
from .pending import Pending
from .preempt import PreemptSignal
from .restore.newest import Loaded, newest_loadable, newest_record
from .store import open_store
from .store.tiers import Tiers
from .timings import Timings, summed
from .write import STRATEGIES, Deadline, reads_through_stream, staging_chunks, stages, start_write
from .write.concurrency import ConcurrencySlots
from .write.native_engine import new_engine
from .write.staging import Staging
from .write.watch import SnapshotWatch

log = logging.getLogger("fastckpt")
_REFUSED = ("the filesystem of {} refused O_DIRECT: checkpoints there are written through the page cache "
            "(buffered: slower, and they evict other cached data); stats['o_direct_refused'] counts them, "
            "direct_io=False says this is intended")
_open_checkpointers: "weakref.WeakSet[Checkpointer]" = weakref.WeakSet()


SLOT_WAIT_S = 0.05  # a save that waits longer for a concurrency slot says the disk is the limit


class Checkpointer:
    """Asynchronous checkpoints of a training state under `root`. See the README for each knob."""

    def __init__(self, root: str | os.PathLike[str] | None = None,
                 settings: CheckpointerConfig | Mapping[str, Any] | None = None, **overrides: Any) -> None:
        """root: where the checkpoints live (None: as the store says). The settings are
        fastckpt.settings.CheckpointerConfig's fields, each with its default and doc there:
        given as keywords (`Checkpointer(root, strategy="c", concurrency=4)`; an unknown one is
        a ConfigError naming the valid ones), or as one CheckpointerConfig or mapping (`settings=`)."""
        self.config = c = with_root(given_one_way(settings, overrides), root)
        self.strategy, self.concurrency, self.writers = c.strategy, c.concurrency, c.writers
        self.chunk_mb, self.staging_mb, self.format = c.chunk_mb, c.staging_mb, c.format
        self.keep, self.verify, self.policy, self.direct_io = c.keep, c.verify, c.policy, c.direct_io
        # on_error="warn": a failed checkpoint is reported (warning + log) and dropped, and training
        # goes on with the previous one intact; "raise" stops the caller at its next call.
        self.on_error = c.on_error
        self.commit_timeout_s = c.commit_timeout_s
        # every wait of the write path fails (WriteStalled) after this long without progress
        self._deadline = Deadline(c.stall_timeout_s, _progress_of(weakref.ref(self)))
        # distributed=None: every rank of an initialised process group saves and commits together;
        # False: this process checkpoints alone (e.g. Lightning's rank 0 under DDP).
        self._agree = make_agreement(c.commit_timeout_s) if c.distributed is not False else Agreement()
        self.rank, self.world_size = self._agree.rank, self._agree.world_size
        self.store = open_store(c, self.rank, self.world_size)
        self.store.join(self._agree)
        note = self.store.strategy_note(c.strategy)
        if note is not None:
            warnings.warn(note, stacklevel=3)
        self.store_kind = self.store.kind
        self.root = self.store.root
        self._named_paths = self.store.names_by_path
        self._slots: ConcurrencySlots[int] = ConcurrencySlots(c.concurrency)
        self._lock = threading.Lock()
        # failed checkpoints and copies nobody observed, raised at the same call on every rank
        self._errors = AgreedErrors(self._agree)
        self.raise_at_save = True  # False: a caller raises them at a call every rank makes (take_errors)
        self._inflight = InFlight(self._deadline, c.commit_timeout_s, self._errors)
        self._commits = OrderedCommits(self._agree, self._deadline, c.commit_timeout_s)
        # tiers: committed saves persisted behind the memory tier (fastckpt.commit.persisting)
        self._persisting = Persisting(self.store, self._deadline, c, self._count, self._retain_behind,
                                      self._errors) if c.tiers else None
        self._fitted = False
        self._saved_step: Optional[int] = None  # the step of the newest save issued (at_step_end promotes it)
        # the settings turned a name ("SIGTERM") into its number
        self._preempt = PreemptSignal(cast(int, c.preempt_signal), c.preempt_grace_s) \
            if c.preempt_signal is not None else None
        self._engine: Any = None  # a _native.Engine once the first save starts writing
        self._staging: Staging | None = None
        self._started = False
        self._counter: int | None = None
        self._closed = False
        # o_direct: files whose data went through O_DIRECT; o_direct_refused: files whose filesystem
        # refused O_DIRECT, written through the page cache instead (warned about once)
        # modes: how each checkpoint's bytes moved (its write's mode: a strategy changed on the way
        # shows here — "device-copy" for a 'c' save that went through spare memory, "pinned-staging"
        # for a 'g' or 'd' one whose device or kvikio could not do it)
        self.stats: dict[str, Any] = {"saves": 0, "skipped": 0, "failed": 0, "pinned": False, "spare_first": 0, "o_direct": 0,
                      "o_direct_refused": 0, "modes": {}, "timings": {}, "timings_first": None, "landed": 0,
                      "slot_waits": 0, "persisted": 0, "persist_failed": 0,
                      "persist_superseded": 0, "persist_skipped": 0, "loaded_from": None}
        self._refused_at: str | None = None  # where O_DIRECT was first refused, until a caller is told
        _open_checkpointers.add(self)

    @classmethod
    def from_config(cls, config: CheckpointerConfig) -> "Checkpointer":
        """A Checkpointer of one settings object (a CheckpointerConfig, as a Hydra config or a
        plugin's settings make it, checked when made): every part of the Checkpointer reads it."""
        return cls(settings=config)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._inflight)} in flight"
        return (f"Checkpointer(root={self.root!r}, store={self.store_kind!r}, strategy={self.strategy!r}, "
                f"concurrency={self.concurrency}, writers={self.writers}, format={self.format!r}, {state})")

    # -- saving ----------------------------------------------------------
    def save(self, state: Any, step: int, meta: dict | None = None, path: str | None = None,
             held: bool = False, watch: Optional[SnapshotWatch] = None, strategy: Optional[str] = None) -> Pending:
        """Issues a checkpoint of `state` at `step`; returns once the snapshot is issued.

        state: a state dict, or a FilePlan its caller laid out itself (fastckpt.dcp: DCP's items).

        path: where this checkpoint goes (store='path' only). held=True: nothing is copied
        until the caller releases records through the returned Pending (layer-wise mode).
        watch: a fastckpt.write.watch.SnapshotWatch over the tensors the snapshot copies after
        save() returns; if one was written in place meanwhile, the checkpoint is dropped
        (TornSnapshotError, always warned about: the training state itself is intact).
        strategy: this save's, in place of the settings' ('d' for a state that is already a
        private copy of its own, as a DCP snapshot its stager staged: a second copy costs time).
        """
        t0 = time.monotonic()
        if strategy is not None and strategy not in STRATEGIES:  # before a slot or a counter is taken
            raise ValueError(f"unknown strategy {strategy!r}; choose one of: {', '.join(STRATEGIES)}")
        strategy = strategy or self.strategy
        clock = Timings()
        self._check_open()
        if (path is not None) != self._named_paths:
            raise ValueError(f"store={self.store_kind!r} here needs save(..., path=...)" if self._named_paths else
                             "save(..., path=...) needs store='path' (or store='pmem' with model=None); "
                             f"store={self.store_kind!r} names its own checkpoints")
        self._raise_background_errors(agreed=True, step=step)
        if not self._started:
            try:
                self._start_writing()
            except CheckpointWriteError as e:  # the root cannot be written at all (read-only, full)
                self.stats["failed"] += 1
                self.report_failure(e)
                failed = Pending(step, -1)
                failed.observed = True
                failed.settle(None, e)
                return failed
            self._started = True
        with clock.phase("slot"):
            slot = self._take_slot()
        self._slot_waited(step, clock.as_dict()["slot"])
        got = slot is not None
        try:
            if isinstance(state, FilePlan) and self.store.layout_format not in (None, state.format):
                raise ValueError(f"store={self.store_kind!r} keeps {self.store.layout_format} files; "
                                 f"this plan lays out a {state.format} file")
            with clock.phase("plan"):
                plan = state if isinstance(state, FilePlan) else \
                    plan_file(state, self.store.layout_format or self.format, self.store.allow_pickle)
            if not self._fitted or self.store.bounded:
                self._fit(plan.file_size)
            if got:
                staging = self._staging
                assert staging is not None  # made by _start_writing, before the first save goes on
                with clock.phase("staging"):
                    chunk = self._engine.pool.chunk_bytes
                    need = staging_chunks(plan, self.store.sink_kind, strategy, chunk)
                    strategy = self._while_staging_grows(staging, plan, need, held, strategy)
                    got = staging.ensure(need)
                self.stats["pinned"] = staging.pinned
        except BaseException:
            if slot is not None:
                self._slots.give_back(slot)
            raise
        # 'skip': a slot and staging on every rank, or the save skipped on every rank (its slot given back)
        if self.policy == "skip" and not self._slots.kept_if_every_rank_has_one(slot, got, self._agree.all_ok):
            self.stats["skipped"] += 1
            warnings.warn(f"fastckpt: skipped the checkpoint of step {step}: {self.concurrency} "
                          "checkpoints are in flight or staging memory is full (policy='skip')",
                          stacklevel=2)
            return Pending(step, -1, skipped=True)
        counter, taken = self._counter, slot
        assert counter is not None and taken is not None  # set by _start_writing; 'skip' returned above without one
        self._counter = counter + 1
        self._saved_step = step
        pending = Pending(step, counter, clock=clock, t0=t0, placed_later=self._persisting is not None)
        write: Any = None
        error: Optional[CheckpointWriteError] = None
        ckpt_id: Optional[str] = None
        file_path: Optional[str] = None
        try:
            with clock.phase("begin"):
                ckpt_id, file_path = self.store.begin(step, counter, self.rank, self.format, path, plan=plan,
                                                      meta=meta)
            with clock.phase("start"):
                write = start_write(self._engine, plan, self.store.sink(file_path, self.direct_io), strategy,
                                    self._deadline, held)
        except OSError as e:
            where = path if path is not None else f"under {self.root}"
            error = CheckpointWriteError(f"cannot write the checkpoint of step {step} {where}: "
                                         f"{e}; the previous checkpoint is intact")
        pending.write, pending.plan, pending.watch = write, plan, watch
        pending.strategy = strategy  # what this save was written with (c -> g while staging grows)
        if write is not None:
            pending.mode = write.mode
            with self._lock:
                self.stats["modes"][write.mode] = self.stats["modes"].get(write.mode, 0) + 1
        unit = CheckpointCommit(self.store, pending, ckpt_id, file_path, meta, self.format, self.rank,
                                self.world_size, landed=lambda p: self._landed(p, taken),
                                retain=self._retain, written=self._written)
        self._commits.issue(unit, error, track=lambda thread: self._inflight.add(pending, ckpt_id, thread))
        self.stats["saves"] += 1
        clock.add("save", time.monotonic() - t0)
        if error is not None:
            pending.observed = True
            self.report_failure(error)
        return pending

    def _fit(self, nbytes: int) -> None:
        """The first save, and every save while the store is bounded: does it have room for
        checkpoints of this size (a memory tier: its keep + concurrency + 1 of them)? Where any
        rank says no, every rank's saves go where there is room from this save on, said once."""
        self._fitted = True
        if not self._agree.all_ok(self.store.fits(nbytes, self.concurrency)):
            note = self.store.shrink(nbytes, self.concurrency)
            log.warning("fastckpt: %s", note)
            warnings.warn(f"fastckpt: {note}", stacklevel=4)

    def _while_staging_grows(self, staging: Staging, plan: FilePlan, need: int, held: bool, strategy: str) -> str:
        """The strategy of this write: 'c' on a stream-read device (CUDA) whose save finds staging
        short (the first one, unless reserve() ran long enough before) copies into spare device
        memory first, as 'g' does, so the gate waits for a device-to-device copy rather than for
        staging being faulted in and pinned; 'g' falls back to 'c' itself when the device is short.
        Never for a held write: it may read a tensor only once the caller released it."""
        if held or strategy != "c" or self.policy != "wait" or not reads_through_stream(plan):
            return strategy
        if not staging.short(need):
            return strategy
        self.stats["spare_first"] += 1
        log.info("fastckpt: staging is still growing (%d of %d chunks free); this checkpoint is copied into "
                 "spare device memory first", self._engine.pool.free_count, need)
        return "g"

    def _start_writing(self) -> None:
        self.store.prepare()
        if self.rank == 0:
            self.store.remove_uncommitted()
        self._counter = max(self._agree.gather(self.store.next_counter()))
        self._engine_now()

    def _engine_now(self) -> Any:
        with self._lock:
            if self._engine is None:
                self._engine = new_engine(self.chunk_mb, self.writers * self.concurrency)
                self._staging = Staging(self._engine, self.concurrency, self.staging_mb, self.policy)
            return self._engine

    def _take_slot(self) -> Optional[int]:
        """One of `concurrency` slots (write.concurrency): waits for the oldest checkpoint in
        flight (policy='wait'), under the deadline; None at once when none is free and policy='skip'."""
        if self.policy == "skip":
            return self._slots.take()
        return self._slots.take(lambda attempt: self._deadline.wait(
            lambda: f"a free slot ({self.concurrency} checkpoints in flight: {self.in_flight()})", attempt,
            slack=self.commit_timeout_s))

    @property
    def stall_timeout_s(self) -> float:
        return self._deadline.stall_s

    def progress(self) -> int:
        """Units its writes moved so far: what its Deadline counts as progress."""
        return self._deadline.seen()

    def reserve(self, nbytes: int, device: str = "cpu") -> None:
        """Faults in staging for one checkpoint of about `nbytes` of tensors on `device` on a
        background thread, so that the first save does not pay for it on the training thread.
        Nothing when writes of this strategy and store draw no staging."""
        self._check_open()
        if not stages(device, self.store.sink_kind, self.strategy):
            return
        self._engine_now()
        assert self._staging is not None  # made with the engine
        self._staging.reserve(nbytes)

    def _written(self, result: Any) -> None:
        """A checkpoint's file is durable (CheckpointCommit.finish, on its commit thread): how its
        bytes went. Only counts and logs: the warning is raised on the caller's thread by the next
        save(), wait() or close() (a warning turned into an error must not fail a commit)."""
        try:
            with self._lock:
                if self._staging is not None:  # pinned as the background grower got to it
                    self.stats["pinned"] = self._staging.pinned
                self.stats["o_direct"] += bool(result.direct_io)
                self.stats["o_direct_refused"] += bool(result.direct_io_refused)
                first = result.direct_io_refused and self.stats["o_direct_refused"] == 1
            if first:
                self._refused_at = os.path.dirname(result.path) or "."
                log.warning("fastckpt: %s", _REFUSED.format(self._refused_at))
        except Exception as e:  # noqa: BLE001 - bookkeeping never fails a durable checkpoint
            log.warning("fastckpt: could not count how the checkpoint at %s was written: %s", result.path, e)

    def _landed(self, pending: Pending, slot: int) -> None:
        """A checkpoint's commit landed (CheckpointCommit): its slot is free again."""
        if pending.error is not None:
            self.stats["failed"] += 1
        with self._lock:
            timings = pending.timings
            summed(self.stats["timings"], {k: v for k, v in timings.items() if k != "gate"})  # see _gate_waited
            self.stats["landed"] += 1
            if self.stats["timings_first"] is None:
                self.stats["timings_first"] = timings
        copying = pending.error is None and self._persisting is not None and self._persisting.landed(pending)
        if not copying:  # else placed once its copy behind the memory tier lands
            pending.placed(pending.error)
        self._inflight.landed(pending)
        self._slots.give_back(slot)  # before retention: deleting old files must not delay the next save

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] += 1

    def _retain_behind(self) -> None:
        """Retention once a copy behind the memory tier landed, on every tier."""
        try:
            cast(Tiers, self.store).retain_behind(self._inflight.directories())  # Persisting: tiers only
        except OSError as e:  # a failed cleanup never fails a committed checkpoint
            log.warning("fastckpt: could not remove old checkpoints under %s: %s", self.root, e)

    def _retain(self) -> None:
        """Retention after the commit is reported: deleting old files is not part of durability
        (timed in stats["timings"]["retain"]: it still takes disk time)."""
        if self.rank != 0 and not self.store.every_rank_retains:
            return
        t = time.monotonic()
        try:
            self.store.retain(self.keep, self._inflight.directories())
        except OSError as e:  # a failed cleanup never fails a committed checkpoint
            log.warning("fastckpt: could not remove old checkpoints under %s: %s", self.root, e)
        finally:
            with self._lock:
                summed(self.stats["timings"], {"retain": time.monotonic() - t})

    # -- preemption --------------------------------------------------------
    def at_step_end(self, step: int, state: Any) -> None:
        """With preempt_signal set, called on every rank once per training step (after the
        optimizer step: `state` is the state of `step`). When the signal reached any rank, every
        rank agrees — in one collective — on this step, checkpoints it (promoting its save in
        flight, when it has one), waits until it is durable on the last tier, and ends the
        process with the signal's status; if preempt_grace_s (from the signal) runs out first, or
        a second signal comes, the process ends at once and the previous checkpoint stays the
        latest. Without a signal it returns at once (after the collective). Nothing when
        preempt_signal is None."""
        if self._preempt is None:
            return

        def save() -> None:
            if self._saved_step != step:
                self.store.hurry()  # straight to the last tier: no copy behind memory to wait for
                self.save(state, step)
            self.close()  # every save durable on the last tier
        self._preempt.at_step_end(lambda came: not self._agree.all_ok(not came), f"step {step}", save)

    # -- waiting ---------------------------------------------------------
    def gate(self, timeout: float | None = None) -> None:
        """Blocks until every snapshot in flight has finished *copying* the caller's tensors.

        Call it before the optimizer step (or anything else that overwrites the saved tensors).
        A copy that makes no progress for stall_timeout_s abandons its checkpoint: the error
        is raised here (on_error="raise") or warned about, and the tensors are free again.
        """
        stalled = self._inflight.wait_copied(timeout, self._gate_waited)
        if stalled is not None:
            self.report_failure(stalled)

    def _slot_waited(self, step: int, seconds: float) -> None:
        """A save that waited for a concurrency slot: checkpoints are issued faster than the disk
        writes them. Counted (stats["slot_waits"]) and said once, in one line, not stalled silently."""
        if seconds < SLOT_WAIT_S:
            return
        with self._lock:
            self.stats["slot_waits"] += 1
            first = self.stats["slot_waits"] == 1
        if first:
            log.warning("fastckpt: save() of step %s waited %.2f s for one of the %d checkpoints in flight to "
                        "commit: checkpoints are issued faster than the disk writes them (Pending.timings "
                        "says where their time goes, stats['timings']['retain'] what deleting old ones "
                        "took); checkpoint less often, or raise concurrency if staging allows (said once; "
                        "stats['slot_waits'] counts them)", step, seconds, self.concurrency)

    def _gate_waited(self, pending: Pending, seconds: float) -> None:
        """The gate's wait, in the stats as it happens (the Pending times its own)."""
        with self._lock:
            self.stats["timings"]["gate"] = self.stats["timings"].get("gate", 0.0) + seconds

    def wait(self) -> None:
        """Blocks until every checkpoint in flight is committed; raises the first error."""
        self._inflight.wait()
        if self._persisting is not None:
            self._persisting.join()
        self._raise_background_errors()

    def in_flight(self) -> list[Pending]:
        """Checkpoints issued and not yet committed (or failed), oldest first."""
        return self._inflight.pendings()

    def _raise_background_errors(self, agreed: bool = False, step: int | None = None) -> None:
        """The failed checkpoints and copies nobody observed, each reported (report_failure).
        agreed (save(), which every rank of the job calls together): in one collective, every rank
        reports every one that failed on any rank, at this same call (fastckpt.commit.agreed_errors),
        and the step it saves is checked the same everywhere (a ValueError on every rank if not);
        else (wait, close: everything landed everywhere) those landed here."""
        where, self._refused_at = self._refused_at, None
        if where is not None:
            warnings.warn(f"fastckpt: {_REFUSED.format(where)}", stacklevel=3)
        if agreed and not self.raise_at_save:
            return
        for error in self._errors.agreed(step) if agreed else self._errors.take_local():
            self.report_failure(error)

    def take_errors(self) -> list[BaseException]:
        """The failed checkpoints and copies nobody observed yet, handed over (each once), for a
        caller that raises them itself at a call every process of its job makes (raise_at_save
        False: Lightning's rank 0 saving alone, lightning_fastckpt.watch)."""
        return self._errors.take_local()

    def raises(self, error: BaseException) -> bool:
        """Whether report_failure(error) raises it (else it warns: on_error='warn')."""
        return self.on_error == "raise" or not isinstance(error, (CheckpointWriteError, OSError))

    def report_failure(self, error: BaseException) -> None:
        """A failed checkpoint, as on_error says: raised, or warned about and dropped."""
        if self.raises(error):
            raise error
        log.error("fastckpt: %s (on_error='warn': training goes on)", error)
        warnings.warn(f"fastckpt: {error} (on_error='warn': training goes on)", stacklevel=3)

    # -- reading ---------------------------------------------------------
    def latest(self, verified: bool = False) -> CommitInfo | None:
        """The newest committed checkpoint: its commit record is intact and its files have the
        sizes the record says (no byte of them is read). verified=True: the newest whose every
        byte also checks against its CRC-32s (reads them all) — what load() returns."""
        return newest_record(self.store, verified)

    def list(self) -> list[CommitInfo]:
        """Every committed checkpoint (see latest()), newest first."""
        return self.store.committed()

    def load(self, step: int | None = None, map_location: Any = "cpu", rank: int | None = None,
             verify: bool | None = None, weights_only: bool = True, into: Any = None,
             mmap: bool | None = None, key: Any = None) -> Any:
        """Returns the state of the newest checkpoint that verifies (or of `step`), falling back
        past corrupt ones with a warning that names them.

        With into=<a state of the same structure>, shapes and dtypes are checked and the
        values copied into its tensors in place (a StateMismatchError lists every difference;
        the checkpoint that differs writes nothing); key= picks one part of the saved state for
        that (into=model.state_dict(), key="model"). From a torch-format file loaded to the CPU
        (weights_only), a tensor that is its whole storage is read straight into (no copy, and
        autograd's version counter is not bumped): a checkpoint passed over (corrupt here, or
        on another rank) may have written into such tensors before the one loaded fills them;
        if none loads, or the one loaded differs in structure, their contents are undefined.
        """
        dest = Destination(into, key) if into is not None else None
        loaded = self._load_record(step, map_location, rank, verify, weights_only, mmap, dest)
        if loaded.skipped:
            warnings.warn(f"fastckpt: loaded step {loaded.info.step}; passed over: {'; '.join(loaded.skipped)}",
                          stacklevel=2)
        from .restore.into import copy_into, part_of
        where = f"checkpoint step {loaded.info.step} in {loaded.info.path}"
        if into is not None:
            return copy_into(into, loaded.state, where, key)
        return loaded.state if key is None else part_of(loaded.state, key, where)

    def load_with_record(self, step: int | None = None, map_location: Any = "cpu", rank: int | None = None,
                         verify: bool | None = None, weights_only: bool = True,
                         mmap: bool | None = None) -> "Loaded":
        """As load(), and also which checkpoint it was and why others were passed over (no warning)."""
        return self._load_record(step, map_location, rank, verify, weights_only, mmap, None)

    def _load_record(self, step: Optional[int], map_location: Any, rank: Optional[int], verify: Optional[bool],
                     weights_only: bool, mmap: Optional[bool], into: Optional[Destination]) -> "Loaded":
        verify = self.verify if verify is None else verify
        rank = self.rank if rank is None else rank
        loaded = newest_loadable(self.store, self._agree, step, rank, map_location, verify, weights_only, mmap, into)
        self.stats["loaded_from"] = self.store.read_from(loaded.info, rank)  # a tier, a partner's replica
        return loaded

    # -- closing ---------------------------------------------------------
    def close(self) -> None:
        """Waits for everything in flight (with tiers and persist_every > 1, the newest checkpoint
        left in memory alone is persisted first), then releases staging memory and threads."""
        if self._closed:
            return
        try:
            self.wait()
            if self._persisting is not None and self._persisting.issue_owed():
                self.wait()  # the newest checkpoint persist_every left in memory alone, persisted
            self._commits.join()  # retention and files made ahead: done before the store closes
        finally:
            self._closed = True
            _open_checkpointers.discard(self)
            self.store.close()
            if self._staging is not None:
                self._staging.close()
                self._staging, self._engine = None, None
            self._agree.close()
            if self._persisting is not None:
                self._persisting.close()
            if self._preempt is not None:
                self._preempt.uninstall()  # its previous handler back, unless the signal came

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this Checkpointer is closed")


def _progress_of(ref: "weakref.ref[Checkpointer]") -> Callable[[], int]:
    """Units moved by a Checkpointer's engine so far (its deadline's measure of progress);
    weak, so that the deadline its writes keep does not keep the Checkpointer alive."""
    def progress() -> int:
        ck = ref()
        engine = ck._engine if ck is not None else None
        return engine.progress if engine is not None else 0
    return progress


@atexit.register
def _wait_at_exit() -> None:
    for ck in list(_open_checkpointers):
        try:
            ck.close()
        except Exception as e:  # noqa: BLE001 - reported, interpreter is exiting
            log.error("fastckpt: a checkpoint failed at exit: %s", e)
