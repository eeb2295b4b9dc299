"""FastStorageReader: a torch.distributed.checkpoint StorageReader that reads as fastckpt reads.

DCP calls, in order (torch.distributed.checkpoint.StorageReader): `reset(checkpoint_id)`,
`read_metadata()`, `set_up_storage_reader(metadata, is_coordinator)`, `prepare_local_plan`,
`prepare_global_plan` (coordinator), `read_data(plan, planner)` (every rank). Resharding is
DCP's planner's: a checkpoint saved on N ranks loads on M; this reader only serves the items
each rank's plan asks for.

read_metadata refuses a checkpoint fastckpt never committed: its commit record (`COMMIT`,
fastckpt.dcp.writer) must be there and intact, every file
it names present at its size, and `.metadata` the bytes it names (size and CRC-32); `.metadata`
is read by the restricted unpickler (fastckpt.dcp.metadata). A directory that DCP's own FileSystemWriter wrote
(no record, and its `.metadata` not marked as fastckpt's) loads, with one warning that there is
no commit record to check it against.

With `tiers=[memory]` (the memory tier FastStorageWriter(tiers=...) wrote through), each file is
read from its memory copy on this node, in any rank's folder there (a resharded load reads other
ranks' files too) — when that copy is the file at its path (fastckpt.store.named_tiers), checked
whole against the commit record's CRCs first; a copy that fails is named in a warning and the file
is read. `reads` says where each file came from.

read_data reads, per file, the items this rank needs: byte items as DCP wrote them, each one's
pickle first run through the restricted unpickler (DCP's planner unpickles it with
weights_only=False: nothing that names a global off the allowlist reaches it); each tensor
item an archive (a torch.save of one tensor: ours or DCP's), parsed by fastckpt's zip validator
(fastckpt.format.zip_reader) at its offset, its pickle run through the restricted unpickler,
every record checked against its CRC-32 (verify=False skips the check). An item stored as the
very tensor the planner hands (a load on the ranks that saved it) is read straight into that
tensor, a file's such items in one parallel pass (fastckpt.dcp.in_place); any other (a
resharded chunk) is read with its neighbours into memory of its own, in batches of at most
STAGED_BATCH bytes, narrowed to the requested chunk and copied into the planner's tensor.
"""
from __future__ import annotations

import dataclasses
import io
import os
import warnings
import zlib
from typing import TYPE_CHECKING, Any, Sequence

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from ..commit import record
from ..commit.record import plain_name
from ..commit_info import CommitInfo
from ..errors import ConfigError, CorruptCheckpointError, NoCheckpointError, UnsafeCheckpointError
from ..format.reading import range_crcs, read_records
from ..format.torch_format import check_crcs, check_structure, read_archives
from ..format.zip_reader import ZipIndex, read_index
from ..fsutil import read_regular
from ..verify import verify_as_recorded
from . import in_place
from .on_s3 import Places, RemoteCheckpoint, is_s3
from .stock_warning import warn_stock_once
from . import metadata as md_file

if TYPE_CHECKING:
    from ..store.named_tiers import NamedTiers

STAGED_BATCH = 256 << 20  # bytes of archives a staged read holds at once
Staged = tuple[ReadItem, ZipIndex, torch.Tensor]  # a staged read's item, its archive, the planner's tensor


class FastStorageReader(StorageReader):
    """Args:
        path: the checkpoint's directory (DCP's checkpoint_id may replace it).
        verify: check every item's CRC-32 as it is read (default).
        threads: parallel readers (default: fastckpt.machine.read_threads(): the reads in flight a
            cold load needs).
        tiers: the memory tier its writer wrote through, e.g. ["/dev/shm/run7"]: files read from
            their memory copies on this node where they verify.
        endpoint: the S3 server of an s3:// checkpoint (None: the one AWS tools find).
    """

    def __init__(self, path: str | os.PathLike[str] | None, verify: bool = True, threads: int | None = None,
                 tiers: Sequence[str | os.PathLike[str]] | None = None, endpoint: str | None = None) -> None:
        super().__init__()
        if path is None:
            raise NoCheckpointError("FastStorageReader(None): there is no checkpoint to read (newest_committed "
                                    "found none under its folder: start from scratch, or name a checkpoint)")
        self.verify, self.threads, self.endpoint = verify, threads, endpoint
        self._places = Places(endpoint=endpoint)  # an s3:// checkpoint's files are downloaded into a spool
        self.remote: RemoteCheckpoint | None = None  # an s3:// checkpoint (fastckpt.dcp.on_s3)
        self._remote_info: CommitInfo | None = None  # its record, checked against its objects
        self.path = self._place(path)
        self.storage_data: dict[MetadataIndex, Any] = {}  # DCP's own per-item storage info, as its reader keeps
        self.commit: CommitInfo | None = None
        self.reads: list[tuple[str, str]] = []  # (where: "memory" | "disk", the file read)
        self._memory: NamedTiers | None = None
        if tiers:
            from ..store.named_tiers import NamedTiers
            if len(tiers) != 1:
                raise ConfigError(f"FastStorageReader(tiers=...) is the one memory tier its writer wrote through, "
                                  f"got {list(tiers)!r}")
            self._memory = NamedTiers(os.fspath(tiers[0]), 1, 0)

    # -- DCP's calls, in order ---------------------------------------------
    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            self.path = self._place(checkpoint_id)
        self.storage_data, self.commit = {}, None

    def _place(self, path: str | os.PathLike) -> str:
        """The local folder the checkpoint is read from: the path, or for an s3:// URL a folder of
        the spool its objects are downloaded into."""
        if self.remote is not None:
            self._places.done(self.remote.local)
        self.remote, self._remote_info = None, None  # a path refused below leaves none placed
        local, self.remote = self._places.place(path)
        return local

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            raise FileNotFoundError("FastStorageReader reads checkpoints committed across ranks: there is no "
                                    "per-rank metadata (use_collectives=False) to read")
        meta_path = os.path.join(self.path, md_file.NAME)
        if self.remote is not None:
            self._remote_info = self.remote.read_record()
            if self._remote_info is None:
                raise CorruptCheckpointError(f"{self.remote.url}: no committed DCP checkpoint there (no "
                                             f"{record.COMMIT_NAME} object: never saved, or a save cut short)")
            self.remote.fetch([md_file.NAME], self._remote_info)
        commit = self._commit()
        try:
            raw = read_regular(meta_path, md_file.MAX_BYTES)
        except FileNotFoundError:
            raise CorruptCheckpointError(f"{self.path}: no DCP checkpoint here ({md_file.NAME} is missing)") from None
        if commit is not None:
            entry = next((f for f in commit.files if f.name == md_file.NAME), None)
            if entry is None or entry.bytes != len(raw) or entry.crc32 != zlib.crc32(raw):
                raise CorruptCheckpointError(f"{meta_path} is not the one its commit record names "
                                             "(replaced or damaged); the checkpoint is not loaded")
        metadata = md_file.decode(raw, meta_path)
        if commit is None:
            if md_file.written_by_fastckpt(metadata):
                raise CorruptCheckpointError(
                    f"{self.path}: fastckpt began this checkpoint but never committed it (no commit record: "
                    "a save killed before its end?); it is not loaded")
            warn_stock_once(self.path, f"fastckpt: {self.path} has no fastckpt commit record (written by DCP's "
                            "own writer?): loading it with each item's own CRC-32 checks only", stacklevel=2)
        self.commit = commit
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if metadata.storage_data is None:
            raise CorruptCheckpointError(f"{self.path}: DCP metadata without storage data")
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            info = self.storage_data.get(item.storage_index)
            if info is None:
                raise CorruptCheckpointError(f"{self.path}: DCP metadata has no storage for {item.storage_index.fqn}")
            per_file.setdefault(plain_name(info.relative_path, os.path.join(self.path, md_file.NAME)), []).append(item)
        if self.remote is not None:
            if self._remote_info is None:
                raise RuntimeError(f"{self.remote.url}: read_data() before read_metadata() (its commit record unread)")
            self.remote.fetch(list(per_file), self._remote_info)
        for name, items in per_file.items():
            path = os.path.join(self.path, name)
            source = self._source(path)
            self.reads.append(("disk" if source == path else "memory", source))
            self._read_file(path, items, planner, source)
        if self.remote is not None:  # every item is in the planner's tensors now: the downloads go
            self.remote.close()
        future: Future[None] = Future()
        future.set_result(None)
        return future

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike)) and (
            "://" not in os.fspath(checkpoint_id) or is_s3(os.fspath(checkpoint_id)))

    # -- reading -----------------------------------------------------------
    def _commit(self) -> CommitInfo | None:
        if self._remote_info is not None:  # checked against its objects; its files come when read
            return dataclasses.replace(self._remote_info, path=self.path)
        try:
            return record.read(self.path, every_rank=False)
        except FileNotFoundError:
            return None

    def _source(self, path: str) -> str:
        """Where path's bytes are read from: its memory copy on this node when there is one that is
        the file there and verifies whole against the commit record, else path."""
        if self._memory is None or self.commit is None:
            return path
        copy = self._memory.copy_of(path)
        entry = next((f for f in self.commit.files if f.name == os.path.basename(path)), None)
        if copy is None or entry is None:
            return path
        try:
            verify_as_recorded(copy, entry)
        except (CorruptCheckpointError, OSError) as e:
            warnings.warn(f"fastckpt: the memory tier's copy of {path} ({copy}) does not verify ({e}); "
                          f"reading {path} instead", stacklevel=4)
            return path
        return copy

    def _read_file(self, path: str, items: list[ReadItem], planner: LoadPlanner, source: str | None = None) -> None:
        """path's items; its bytes read from source (its memory copy, or path itself)."""
        if self.commit is not None and os.path.basename(path) not in {f.name for f in self.commit.files}:
            raise CorruptCheckpointError(f"{path} is not a file of the committed checkpoint {self.path}")
        path = source or path
        items = sorted(items, key=lambda i: self.storage_data[i.storage_index].offset)  # the file read in order
        blobs = [i for i in items if i.type == LoadItemType.BYTE_IO]
        tensors = [i for i in items if i.type != LoadItemType.BYTE_IO]
        if blobs:
            spans = [(self.storage_data[i.storage_index].offset, self.storage_data[i.storage_index].length)
                     for i in blobs]
            for item, (off, length) in zip(blobs, spans):  # before DCP's planner unpickles it
                safe_byte_item(path, off, length, item.storage_index.fqn)
            data, _ = read_records(path, spans, False, False, self.threads)
            for item, buf in zip(blobs, data):
                planner.load_bytes(item, io.BytesIO(buf.numpy().tobytes()))
        if tensors:
            indexes = [read_index(path, self.storage_data[i.storage_index].offset,
                                  self.storage_data[i.storage_index].length) for i in tensors]
            targets = [planner.resolve_tensor(i).detach() for i in tensors]
            known: dict[int, int] = {}  # the CRC-32 of each data.pkl fits() read: not read again
            direct = [in_place.fits(path, idx, i.storage_offsets, i.lengths, t, known)
                      for i, idx, t in zip(tensors, indexes, targets)]
            placed = [(i.storage_index.fqn, idx, t) for i, idx, t, d in zip(tensors, indexes, targets, direct) if d]
            in_place.read(path, placed, self.verify, self.threads, known)
            for item, target, d in zip(tensors, targets, direct):
                if d:
                    planner.commit_tensor(item, target)
            staged = [(i, idx, t) for i, idx, t, d in zip(tensors, indexes, targets, direct) if not d]
            for batch in _batches(staged):
                self._read_staged(path, batch, planner)

    def _read_staged(self, path: str, batch: list[Staged], planner: LoadPlanner) -> None:
        """(item, archive, target) each: the archives read whole into memory of their own, then each
        chunk asked for copied into its target (a resharded load's items, or tensors not on the CPU)."""
        tensors, indexes, targets = zip(*batch)
        try:
            values = read_archives(path, list(indexes), "cpu", self.verify, self.threads)
        except CorruptCheckpointError as e:  # which item: each archive checked on its own
            bad = next((i.storage_index.fqn for i, idx in zip(tensors, indexes) if not archive_intact(path, idx)), None)
            raise CorruptCheckpointError(f"DCP item {bad!r}: {e}" if bad else str(e)) from None
        for item, value, target in zip(tensors, values, targets):
            value = _chunk(value, item.storage_offsets, item.lengths)
            if target.size() != value.size():
                raise CorruptCheckpointError(f"{path}: {item.storage_index.fqn} holds {tuple(value.size())}, "
                                             f"the plan asks for {tuple(target.size())}")
            target.copy_(value)
            planner.commit_tensor(item, target)


def _batches(staged: list[Staged], limit: int = STAGED_BATCH) -> list[list[Staged]]:
    """Consecutive runs of items whose archives hold at most `limit` bytes together (one item
    alone may hold more): memory for a staged read is bounded, and reused from batch to batch."""
    out: list[list[Staged]] = [[]]
    size = 0
    for entry in staged:
        n = entry[1].comment_off - entry[1].base
        if out[-1] and size + n > limit:
            out.append([])
            size = 0
        out[-1].append(entry)
        size += n
    return [b for b in out if b]


def check_archive(path: str, idx: ZipIndex) -> None:
    """Every record of one item's archive read and checked against its CRC-32 (raises
    CorruptCheckpointError): what verify does to each item, and a failed read to find which."""
    order = idx.ordered()
    check_crcs(path, idx, order, range_crcs(path, [(e.data_off, e.size) for e in order]))


def archive_intact(path: str, idx: ZipIndex) -> bool:
    try:
        check_archive(path, idx)
    except CorruptCheckpointError:
        return False
    return True


def safe_byte_item(path: str, offset: int, length: int, fqn: str) -> None:
    """A byte item (any value but a tensor: DCP torch.saves it) is read by DCP's planner with
    torch.load(weights_only=False), which runs whatever its pickle names. Its archive is parsed and
    its pickle run through the restricted unpickler first: a global off the allowlist is refused
    (UnsafeCheckpointError, naming the item) and the planner never sees it."""
    try:
        check_structure(path, read_index(path, offset, length))
    except (UnsafeCheckpointError, CorruptCheckpointError) as e:
        raise type(e)(f"DCP item {fqn!r}: {e}") from None


def _chunk(tensor: torch.Tensor, offsets: Sequence[int], lengths: Sequence[int]) -> torch.Tensor:
    """The part of a stored chunk a read item asks for (offsets into the stored chunk)."""
    for dim, (offset, length) in enumerate(zip(offsets, lengths)):
        if offset < 0 or offset + length > tensor.size(dim):
            raise CorruptCheckpointError(f"a read item asks for {offset}..{offset + length} of dimension {dim}, "
                                         f"which holds {tensor.size(dim)}")
        if tensor.size(dim) != length:
            tensor = tensor.narrow(dim, offset, length)
    return tensor
