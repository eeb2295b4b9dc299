"""FastStorageWriter: a torch.distributed.checkpoint StorageWriter that writes as fastckpt writes.

DCP calls, in order (torch.distributed.checkpoint.StorageWriter): `reset(checkpoint_id)`,
`set_up_storage_writer(is_coordinator, rank=, use_collectives=)`, `prepare_local_plan` (every
rank: the directory), `prepare_global_plan` (coordinator: each rank's file prefix, `__R_`, as
DCP's FileSystemWriter names them), `write_data(plan, planner)` (every rank), `finish(metadata,
results)` (coordinator, once every rank's write_data is done).

write_data lays this rank's items out in one file (fastckpt.dcp.layout: byte items as DCP
writes them, each tensor a torch.save archive of its own) and saves it as one fastckpt save
(a Checkpointer over the path store, from the same settings as any: strategy, writers,
chunk_mb, stall_timeout_s, ...): planned up front, copied and written in parallel, O_DIRECT,
CRC-32 per chunk, fsync'ed, renamed into place. Its future is done once the file is durable
(every wait under the settings' deadline); each item's WriteResult says where it lies
(`_StorageInfo(file, offset, length)`, the stock reader's own), and one more result carries the
file's entry for the commit record (its size, CRC-32 and chunk CRCs).

finish is the commit (fastckpt.commit.file_sets.commit_gathered: a GatheredCommit through the
ordered commit, fastckpt.commit.protocol): DCP has gathered every rank's results, so every
rank's file is durable; the coordinator's part is `.metadata` (written as DCP does, atomically
and durably, marked as fastckpt's), and then comes the one commit record, `COMMIT`
(fastckpt.commit.record's, as every fastckpt checkpoint's), naming every file and `.metadata`
with their sizes and CRCs — and the files the caller named in `also_commit`, which it wrote
durably into the directory with fastckpt.save before the save (Lightning's `meta.pt`: the rest
of a Lightning checkpoint). A directory
whose record was never written is not loaded by FastStorageReader; the stock FileSystemReader
loads a committed one unchanged.

Failure and leftovers. Whether every rank's file landed is agreed on the writer's own gloo
groups (made when it is constructed, on every rank: make one writer and reuse it) before
write_data's future resolves: a save that failed on any rank (a full disk, a torn snapshot) is
failed on all, and every rank removes its file, then the coordinator the directory — a failed
save leaves nothing behind. Saves killed outright leave folders; each save removes the ones of
its parent older than the newest checkpoint there to resume from (prepare_global_plan).
"""
from __future__ import annotations

import dataclasses
import io
import logging
import os
import shutil
import threading
import uuid
import weakref
import zlib
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional, cast

import torch
from torch.distributed.checkpoint import filesystem as dcp_files
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from ..commit.agreement import make_agreement
from ..commit.file_sets import commit_gathered, gathered_commits
from ..commit.record import plain_name
from ..commit_info import FileEntry
from ..format.zip_reader import read_index
from ..fsutil import fsync_dir, makedirs_durable
from ..named import NamedCheckpoints
from ..errors import CheckpointWriteError, TornSnapshotError
from ..settings import CheckpointerConfig, given_one_way, placed_by_path
from ..workers import Workers
from ..write.deadline import Deadline
from . import metadata as md_file
from .committed import cut_short_below, resumable, withdraw
from .layout import plan_items
from .names import SUFFIX, step_of_name
from .on_s3 import Places, RemoteCheckpoint, is_s3

if TYPE_CHECKING:
    from ..pending import Pending
    from .slots import Slot, SnapshotOwner

log = logging.getLogger("fastckpt")
FILE_ENTRY = "__fastckpt_file__"  # the fqn of the extra WriteResult that carries a file's entry


def _quietly(call: Callable[[], object], what: str) -> None:
    """call(); an OSError logged (the object store unreachable while a failed save is cleaned up:
    the next save sweeps what is left)."""
    try:
        call()
    except OSError as e:
        log.warning("fastckpt: %s failed: %s", what, e)


def storage_info(name: str, offset: int, length: int) -> dcp_files._StorageInfo:
    """Where an item lies, as DCP's own FileSystemWriter says it (its private _StorageInfo: the
    type its stock reader finds in .metadata, so that reader loads our checkpoints)."""
    return dcp_files._StorageInfo(name, offset, length)


class FastStorageWriter(StorageWriter):
    """Args:
        path: the checkpoint's directory (DCP's checkpoint_id may replace it per save).
        step: what the commit record says of this checkpoint (-1: the number its directory's name
            ends with, as torchtitan's step-12, else none); per save: expect().
        settings: the Checkpointer's settings (fastckpt.settings.CheckpointerConfig's fields
            but root, store, keep, distributed and model), checked here, e.g. strategy="c",
            writers=4, chunk_mb=64, stall_timeout_s=120; or a CheckpointerConfig. Their `tiers`
            put a memory tier in front of the checkpoint's files, e.g. ["/dev/shm/run7"] (tier_keep:
            how many files each rank keeps there, [1] by default): each rank's file commits there
            and is persisted to its path from that copy; the commit record is written once every
            file is on disk; FastStorageReader(tiers=...) reads each file from its memory copy
            on this node (fastckpt.store.named_tiers).
    """

    def __init__(self, path: str | os.PathLike[str], step: int = -1,
                 settings: CheckpointerConfig | Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.step = step
        self.config = placed_by_path(given_one_way(settings, kwargs))  # the path store's
        # this save's checkpoint's folder, and those in flight: an s3:// one's is in a spool, its files
        # uploaded from there (fastckpt.dcp.on_s3)
        self._places = Places(self.config.stall_timeout_s, self.config.endpoint)
        self.path, self.remote = self._places.place(path)
        self._set_up = False  # whether a save was set up in this placement (else reset() lets go of it)
        self.also_commit: list[str] = []  # files the caller wrote durably into the checkpoint's directory
        self._expected: dict[str, tuple[int, list[str]]] = {}  # path -> (step, also_commit) of its save
        self._this: tuple[int, list[str]] = (step, [])  # the save in progress's (taken at reset)
        self.save_id = uuid.uuid4().hex
        self.rank, self.is_coordinator = 0, True
        # whether every rank's file of a save landed, asked on gloo groups of the writer's own (made
        # here, on every rank, as a FastStager's are): a save failed on one rank is removed on all
        self._agree = make_agreement(self.config.commit_timeout_s)
        self._commits = gathered_commits(self.config.stall_timeout_s)  # the coordinator's, in finish order
        # the FastStagers given this writer (FastStager(writer=...)), weakly
        self._stagers: list[weakref.ReferenceType[SnapshotOwner]] = []
        self._workers = Workers("fastckpt-dcp")  # each save's waits, on warm threads (fastckpt.workers)
        self.named = NamedCheckpoints(self.config)  # every file of every save goes through it

    def meet(self, stager: SnapshotOwner) -> None:
        """FastStager(writer=this) calls it: that stager's snapshots are written as they lie when
        copied at stage(), or (its tensors handed on live) copied here with its strategy, the
        stager told when (writer_copied)."""
        self._stagers.append(weakref.ref(stager))

    def progress(self) -> int:
        """What this writer's saves moved so far: a wait for them that sees it grow is not stalled
        (a FastStager given this writer waits so)."""
        return self.named.progress()

    def _slot_of_a_stager(self, ask: Callable[[SnapshotOwner], Optional[Slot]]) -> Optional[Slot]:
        """The first slot a stager given this writer answers `ask` with, or None."""
        for ref in self._stagers:
            stager = ref()
            slot = ask(stager) if stager is not None else None
            if slot is not None:
                return slot
        return None

    # -- DCP's calls, in order ---------------------------------------------
    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            if not self._set_up:  # placed, never saved into (the path given, each save naming its own)
                self._places.done(self.path)
            self.path, self.remote = self._places.place(checkpoint_id)
            self._set_up = False

    def _id(self) -> str:
        """What the checkpoint is called: its URL, or its directory's absolute path."""
        return self.remote.url if self.remote is not None else os.path.abspath(self.path)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Every save calls it (reset only when a checkpoint_id is given): this save's own id, step
        and files to commit are taken here."""
        if not kwargs.get("use_collectives", True):
            raise ValueError("FastStorageWriter commits one checkpoint across ranks: "
                             "use_collectives=False (a checkpoint per rank) is not supported")
        self.is_coordinator, self.rank = is_coordinator, kwargs.get("rank") or 0
        self._set_up = True
        self.save_id = uuid.uuid4().hex
        step, also = self._expected.pop(self._id(), (self.step, list(self.also_commit)))
        self._this = (step if step >= 0 else step_of_name(os.path.basename(os.path.normpath(self._id()))), also)

    def storage_meta(self) -> Optional[StorageMeta]:
        return StorageMeta(checkpoint_id=self.remote.url if self.remote is not None else self.path,
                           save_id=self.save_id, modules=[md_file.WRITTEN_BY])

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        makedirs_durable(self.path)
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Coordinator, after every rank planned and before any writes: a checkpoint this directory
        held is withdrawn first (its record, then its .metadata), so a save cut short here is never
        taken for the old checkpoint by our reader or DCP's."""
        withdraw(self.path)
        if self.remote is not None:
            self.remote.withdraw()
            self.remote.sweep_older()
        else:
            self._sweep()
        return [dataclasses.replace(p, storage_data=f"__{i}_") for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """This rank's file, begun now; its future is done once it is durable and every rank's
        is (agreed: a rank that failed, even here before its write began, fails the save on all)."""
        name = f"{plan.storage_data}0{SUFFIX}"
        directory, coordinator, remote = self.path, self.is_coordinator, self.remote
        path = os.path.join(directory, name)
        future: Future[list[WriteResult]] = Future()
        landed: Callable[[], list[WriteResult]] | BaseException
        pending: Optional[Pending]
        try:
            landed, pending = self._begin_file(plan, planner, name, path)
        except BaseException as e:  # noqa: BLE001 - agreed below: every rank's save fails with it
            landed, pending = e, None

        def durable() -> None:
            results: Optional[list[WriteResult]] = None
            error = landed if isinstance(landed, BaseException) else None
            if error is None:
                try:
                    results = cast(Callable[[], list[WriteResult]], landed)()  # not an exception: a call
                except BaseException as e:  # noqa: BLE001 - DCP raises it on every rank
                    error = e
            try:
                if self._agree.all_ok(error is None, background=True):
                    assert results is not None  # no error here: landed() returned them
                    future.set_result(results)
                    return
                self._discard(directory, path, coordinator, remote)
            except BaseException as e:  # noqa: BLE001 - the agreement itself failed (a rank is gone)
                error = error or e
            # torch.futures.Future.set_exception's parameter is typed as the result type T
            future.set_exception(error or CheckpointWriteError(  # type: ignore[arg-type]
                f"{directory}: another rank's part of this DCP save failed; this rank's file was removed"))

        if pending is None or pending.done():
            durable()
        else:
            self._workers.run(durable, "fastckpt-dcp-durable")
        return future

    def _begin_file(self, plan: SavePlan, planner: SavePlanner, name: str,
                    path: str) -> tuple[Callable[[], list[WriteResult]], Pending]:
        """Starts this rank's file: (a call that waits until it is durable and returns DCP's write
        results, the save in flight)."""
        items: list[WriteItem] = []
        values: list[torch.Tensor | bytes] = []
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                values.append(data.getvalue() if isinstance(data, io.BytesIO) else bytes(data))
            else:
                values.append(cast(torch.Tensor, data).detach())  # not BYTE_IO: a tensor
            items.append(item)
        slots = {self._slot_of_a_stager(lambda stager: stager.snapshot_of(v))  # the one holding each tensor
                 for v in values if isinstance(v, torch.Tensor)}
        me = threading.current_thread()  # this save's own snapshot, though none of its tensors is planned here
        taken = self._slot_of_a_stager(lambda stager: stager.taken_by(me))
        ours = [s for s in slots | {taken} if s is not None]
        for slot in ours:
            slot.order_after_stage()  # before anything here reads a tensor (plan_items clones some views)
        file_plan, places = plan_items(values)
        strategy = self._strategy_for(slots)
        if (strategy == "d" and file_plan.devices() <= {"cpu"}
                and any(getattr(ref(), "hands_on_live", False) for ref in self._stagers)):
            # the stager copied this snapshot whole (its run has not yet earned trust); its next
            # saves hand the optimizer's tensors on live, to be copied into this writer's own
            # staging: grown in the background now, not on the training thread's gate then
            self.named.checkpointer.reserve(file_plan.file_size)
        pending = self.named.save(file_plan, path, self._this[0], strategy=strategy)
        self._tell_when_copied(pending, [s for s in ours if s.live])
        results = [WriteResult(index=item.index, size_in_bytes=p.length,
                               storage_data=storage_info(name, p.offset, p.length))
                   for item, p in zip(items, places)]
        deadline = Deadline(self.config.stall_timeout_s, self.named.progress)
        directory, rank, remote, coordinator = self.path, self.rank, self.remote, self.is_coordinator

        def landed() -> list[WriteResult]:
            deadline.wait(f"{path} of the DCP checkpoint {directory}", pending.wait_done)
            info = pending.wait()
            if info is None:
                raise RuntimeError(f"{path} of the DCP checkpoint {directory}: its save was skipped (the writer's "
                                   f"policy={self.config.policy!r}), so it was never written")
            # behind a memory tier: the record DCP's finish writes vouches for the file at its path
            deadline.wait(f"{path} of the DCP checkpoint {directory}, persisted", pending.wait_placed)
            pending.raise_placed()
            torn = next((t for t in (s.torn() for s in slots if s is not None and s.live) if t), "")
            if torn:  # FastStager's 'd', or 'c' copied here: the snapshot was the live tensors until then
                raise TornSnapshotError(f"{torn} was written in place before this save had copied or written it "
                                        f"(a FastStager snapshot of the live tensors); {directory} is not committed")
            f = info.files[0]
            etag = ""
            if remote is not None:  # durable here: uploaded, then the spooled file is not needed
                etag = remote.upload(path, self.config.chunk_mb << 20)
                os.unlink(path)
                if not coordinator:  # the coordinator's folder holds .metadata next
                    self._places.done(directory)
            entry = FileEntry(name, rank, info.bytes, f.crc32, f.spans, f.records, etag)
            return results + [WriteResult(index=MetadataIndex(f"{FILE_ENTRY}/{name}"), size_in_bytes=info.bytes,
                                          storage_data=entry)]

        return landed, pending

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        storage, files = {}, []
        for rank_results in results:
            for r in rank_results:
                if isinstance(r.storage_data, FileEntry):
                    files.append(r.storage_data)
                else:
                    storage[r.index] = r.storage_data
        metadata.storage_data = storage
        metadata.storage_meta = self.storage_meta()
        metadata.version = dcp_files.CURRENT_DCP_VERSION
        (step, also), directory, remote = self._this, self.path, self.remote  # this save's, whatever the next sets

        def part() -> list[FileEntry]:  # the coordinator's own part, durable: .metadata (and what it commits too)
            raw = md_file.write(os.path.join(directory, md_file.NAME), metadata)
            entries = files + [FileEntry(md_file.NAME, 0, len(raw), zlib.crc32(raw))]
            entries += [self._entry_of(directory, name) for name in also]  # e.g. Lightning's meta.pt
            if remote is not None:
                local = [e for e in entries if e.name == md_file.NAME or e.name in also]
                entries = [e for e in entries if e not in local] + [
                    dataclasses.replace(e, etag=remote.upload(os.path.join(directory, e.name))) for e in local]
            return entries

        try:
            commit_gathered(remote.url if remote is not None else directory, part, step, len(results), self._commits,
                            meta={"dcp": True}, write=remote.commit if remote is not None else None)
        finally:
            self._places.done(directory)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike)) and (
            "://" not in os.fspath(checkpoint_id) or is_s3(os.fspath(checkpoint_id)))

    # -- fastckpt's own -----------------------------------------------------
    def expect(self, path: str | os.PathLike[str], step: int = -1, also_commit: Iterable[str] = ()) -> None:
        """What the save into `path` records, said before it is issued: its step, and the files
        (written durably with fastckpt.save into that directory) its record also names. Each save
        takes its own when it starts, so saves in flight at once never see each other's."""
        p = os.fspath(path)
        self._expected[p.rstrip("/") if is_s3(p) else os.path.abspath(p)] = (step, list(also_commit))

    @staticmethod
    def _entry_of(directory: str, name: str) -> FileEntry:
        """The record's entry of a file fastckpt.save wrote into directory (its own CRC-32, which
        verify checks)."""
        path = os.path.join(directory, plain_name(name, directory))
        idx = read_index(path)
        if idx.file_crc is None:
            raise ValueError(f"{path}: also_commit takes files written by fastckpt.save (their CRC-32 is "
                             "what the record and fastckpt verify check)")
        return FileEntry(name, 0, os.path.getsize(path), idx.file_crc)

    def _strategy_for(self, slots: set[Optional[Slot]]) -> Optional[str]:
        """A FastStager's snapshot copied whole at stage() is written as it lies, with strategy
        'd': the copy is private and page-aligned, a second one would only cost time. One that
        holds live tensors is copied here with its stager's strategy. Anything else: the
        writer's own (None)."""
        if not slots or None in slots:
            return None
        live = [s for s in cast("set[Slot]", slots) if s.live]
        return live[0].strategy if live else "d"

    def _tell_when_copied(self, pending: Pending, slots: list[Slot]) -> None:
        """Once this save has copied the live tensors of those FastStager snapshots, their stagers'
        gates let the optimizer step go. A save that fails first tells nobody: the gate then
        waits until the save is over, as for a snapshot written in place."""
        if not slots:
            return
        owed = [(slot, slot.seq) for slot in slots]
        stagers = [ref() for ref in self._stagers]

        def tell() -> None:
            try:
                pending.wait_copied()
            except BaseException:  # noqa: BLE001 - the save's own error reaches DCP through write_data
                return
            for slot, seq in owed:
                for stager in stagers:
                    if stager is not None:
                        stager.writer_copied(slot, seq)  # the one that owns the slot takes it

        self._workers.run(tell, "fastckpt-dcp-copied")

    def _sweep(self) -> None:
        """Saves cut short (killed) pile up beside the committed ones: each save removes those of
        its folder's parent older than the newest checkpoint there to resume from. Every rank has
        planned this save, so none is still writing an earlier one (committed.cut_short_below)."""
        parent = os.path.dirname(os.path.abspath(self.path))
        for old in cut_short_below(resumable(parent)):
            if os.path.abspath(old) != os.path.abspath(self.path):
                shutil.rmtree(old, ignore_errors=True)

    def _discard(self, directory: str, path: str, coordinator: bool,
                 remote: Optional[RemoteCheckpoint] = None) -> None:
        """A save that failed on some rank: every rank removes its own file, then (once every rank
        has, agreed) the coordinator removes what else the save put in its directory, and the
        directory when nothing else is left there — so a failed save leaves no file behind, and a
        full disk has room for the next one."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        if remote is not None:  # its object deleted; a server that is down is no reason to skip the collective
            _quietly(lambda: remote.discard([os.path.basename(path)]), f"deleting {remote.url}/{os.path.basename(path)}")
        self._agree.all_ok(True, background=True)
        if remote is not None:
            try:
                if coordinator:
                    _quietly(remote.discard, f"deleting what the failed save put under {remote.url}")
            finally:
                self._places.done(directory)
            return
        if not coordinator:
            return
        withdraw(directory)
        try:
            os.rmdir(directory)
            fsync_dir(os.path.dirname(os.path.abspath(directory)))
        except OSError:
            fsync_dir(directory)  # something else is there: the directory stays, without our files

    def close(self) -> None:
        """Waits for every file and commit in flight and closes the writer's Checkpointers and groups;
        its idle threads end (a save's wait for its agreement still running ends after it)."""
        try:
            self._commits.join()
            self.named.close()
            self._places.close()
        finally:
            self._workers.retire()
            self._agree.close()
