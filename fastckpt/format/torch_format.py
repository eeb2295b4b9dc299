"""The default format: torch.save's zip archive, planned and read in parallel.

Owns turning a state into a FilePlan (data.pkl, the small records torch
writes, one 4096-aligned record per storage, the directory) and turning a
file back into a state: every record read in parallel with its CRC checked,
then data.pkl unpickled by the restricted unpickler. With into= (a fitting.Destination), each
storage a destination tensor holds whole is read straight into that tensor.
"""
from __future__ import annotations

import os
import sys
import time
import warnings
import zlib

import torch

from .. import _native
from ..errors import CorruptCheckpointError
from . import zip_layout as zl
from .plan import ALIGN, DataRecord, FilePlan
from .fitting import Destination, in_place
from .reading import file_bytes, range_crcs, read_into, read_records
from .safe_unpickler import unpickle
from .torch_pickle import pickle_state
from .zip_reader import ZipIndex, read_index

PREFIX = "archive/"


def plan_torch(state) -> FilePlan:
    pkl, refs = pickle_state(state)
    serial = f"{time.time_ns() % 10**20:020d}{os.getpid() % 10**10:010d}{id(pkl) % 10**10:010d}"
    head = [zl.Record(PREFIX + "data.pkl", len(pkl), blob=pkl),
            zl.Record(PREFIX + ".format_version", 1, blob=b"1"),
            zl.Record(PREFIX + ".storage_alignment", 2, blob=b"64"),
            zl.Record(PREFIX + "byteorder", len(sys.byteorder), blob=sys.byteorder.encode())]
    data = [zl.Record(f"{PREFIX}data/{r.key}", r.nbytes, align=ALIGN, source=r) for r in refs]
    tail = [zl.Record(PREFIX + "version", 2, blob=b"3\n"),
            zl.Record(PREFIX + ".data/serialization_id", len(serial), blob=serial.encode())]
    records = head + data + tail
    cd_offset = zl.place(records)
    for r in head + tail:
        r.crc = zlib.crc32(r.blob)
    file_size = cd_offset + zl.tail_size(records, cd_offset)
    # no tensor at all (a DeepSpeed pipeline layer without parameters, a dict of counters):
    # an empty data extent at an aligned offset, everything else is written as blobs
    data_begin = data[0].data_off if data else cd_offset - cd_offset % ALIGN
    data_end = data[-1].data_off + data[-1].size if data else data_begin

    def finish(crcs: list[int]) -> tuple[list[tuple[int, bytes]], int]:
        for r, c in zip(data, crcs):
            r.crc = c
        blobs: list[tuple[int, bytes]] = []
        file_crc = 0
        for r in records:
            header = r.local_header()
            if r.blob is not None:
                blobs.append((r.header_off, header + r.blob))
                file_crc = zlib.crc32(header + r.blob, file_crc)
            else:
                blobs.append((r.header_off, header))
                file_crc = _native.crc32_concat(zlib.crc32(header, file_crc), r.crc, r.size)
        tail_bytes = zl.tail_bytes(records, cd_offset)
        file_crc = zlib.crc32(tail_bytes, file_crc)
        blobs.append((cd_offset, tail_bytes + zl.comment_for(file_crc)))
        return blobs, file_crc

    recs = [DataRecord(r.name, r.data_off, r.size, r.source.storage) for r in data]
    return FilePlan("torch", recs, data_begin, data_end, file_size, finish)


def _restore(storage: torch.UntypedStorage, location: str, map_location):
    if map_location is None:
        target = location
    elif isinstance(map_location, dict):
        target = map_location.get(location, location)
    elif callable(map_location):
        out = map_location(storage, location)
        return storage if out is None else out
    else:
        target = str(map_location)
    if target == "cpu" or target.startswith("cpu"):
        return storage
    # Tensor.to has taken a device positionally in every torch; UntypedStorage.to's device is
    # keyword-only (and torch 2.11 refuses it positionally)
    return torch.empty(0, dtype=torch.uint8).set_(storage).to(device=torch.device(target)).untyped_storage()


def _to_cpu(map_location) -> bool:
    """Whether every storage is restored on the CPU whatever its saved location."""
    return isinstance(map_location, (str, torch.device)) and str(map_location).startswith("cpu")


def read_torch(path: str, map_location=None, verify: bool = True, weights_only: bool = True,
               threads: int | None = None, index: ZipIndex | None = None, expect_crc: int | None = None,
               mmap: bool | None = None, into: Destination | None = None):
    """Loads a torch-format file (ours or torch.save's) without executing code from it.
    into: tensors the state is loaded into (a CPU load): each whole storage that fits one is
    read straight into it (_in_place), and the state returned holds that tensor's memory; the
    caller copies the rest. A record that then fails its CRC leaves its tensor overwritten."""
    idx = index or read_index(path)
    if "data.pkl" not in idx.entries:
        raise CorruptCheckpointError(f"{path}: archive has no data.pkl record")
    order = idx.ordered()
    # in place only where the structure is parsed by the restricted unpickler (weights_only): a
    # trusted file's pickle runs code, and is unpickled once, below
    placed = _in_place(path, idx, into) if into is not None and weights_only and _to_cpu(map_location) else None
    if placed:
        data, crcs = _read_placed(path, order, placed, verify, threads)
    else:
        data, crcs = read_records(path, [(e.data_off, e.size) for e in order], verify, mmap, threads)
    bufs = {e.name[len(idx.prefix):]: b for e, b in zip(order, data)}
    if verify:
        check_crcs(path, idx, order, crcs)
        if expect_crc is not None and idx.file_crc != expect_crc:
            raise CorruptCheckpointError(
                f"{path}: file CRC-32 {idx.file_crc!r} differs from its commit record ({expect_crc:08x})")
    pkl = bufs["data.pkl"].numpy().tobytes()  # small; copied out of the mapping

    def storage(key: str, nbytes: int, location: str) -> torch.UntypedStorage:
        return _restore(bufs[f"data/{key}"].untyped_storage(), location, map_location)

    return _unpickle_records(path, pkl, {k: b.numel() for k, b in bufs.items()}, storage, weights_only)


def _in_place(path: str, idx: ZipIndex, into: Destination) -> dict[int, torch.Tensor] | None:
    """{record offset: the tensor it is read into} (fitting.in_place over the file's structure,
    parsed onto the meta device), or None."""
    keys: dict[int, str] = {}
    structure = check_structure(path, idx, keys=keys)
    placed = in_place(into, structure, lambda t: keys.get(t.untyped_storage()._cdata))
    if not placed:
        return None
    return {idx.entries[f"data/{key}"].data_off: t for key, t in placed.items()}


def _read_placed(path: str, order, placed: dict[int, torch.Tensor], verify: bool, threads):
    """Every record of `order` read in one parallel pass: a placed one into its tensor (returned
    as a byte view of that tensor's storage), any other into a buffer of its own."""
    bufs = [placed[e.data_off] if e.data_off in placed else torch.empty(e.size, dtype=torch.uint8) for e in order]
    crcs = read_into(path, [(b, e.data_off) for b, e in zip(bufs, order)], verify, threads)
    as_bytes = [torch.empty(0, dtype=torch.uint8).set_(b.untyped_storage()) if b.dtype != torch.uint8 else b
                for b in bufs]
    return as_bytes, list(crcs)


def read_archives(path: str, indexes: list[ZipIndex], map_location=None, verify: bool = True,
                  threads: int | None = None, mmap: bool = False) -> list:
    """Several archives of one file (a DCP file's tensor items: fastckpt.dcp), each as
    read_torch reads one, their records read in one parallel pass; returns their states."""
    orders = [idx.ordered() for idx in indexes]
    for idx in indexes:
        if "data.pkl" not in idx.entries:
            raise CorruptCheckpointError(f"{path}: the archive at byte {idx.base} has no data.pkl record")
    data, crcs = read_records(path, [(e.data_off, e.size) for order in orders for e in order], verify, mmap, threads)
    states, at = [], 0
    for idx, order in zip(indexes, orders):
        mine, mine_crcs = data[at:at + len(order)], crcs[at:at + len(order)]
        at += len(order)
        if verify:
            check_crcs(path, idx, order, mine_crcs)
        bufs = {e.name[len(idx.prefix):]: b for e, b in zip(order, mine)}
        pkl = bufs["data.pkl"].numpy().tobytes()

        def storage(key: str, nbytes: int, location: str, bufs=bufs) -> torch.UntypedStorage:
            return _restore(bufs[f"data/{key}"].untyped_storage(), location, map_location)

        states.append(_unpickle_records(f"{path}@{idx.base}", pkl, {k: b.numel() for k, b in bufs.items()},
                                        storage, True))
    return states


def check_structure(path: str, idx: ZipIndex, crcs: dict | None = None, at: int | None = None,
                    keys: dict | None = None):
    """Everything a load checks but the bytes: data.pkl passes the restricted unpickler with
    every storage it names present at its size and every view inside its storage (the
    storages are on the meta device: nothing is read or allocated). Returns the structure,
    its tensors on the meta device. crcs: data.pkl's CRC-32 is put there under its record's
    file offset, so that a verified read need not read it again. at: where the caller holds the
    whole file's bytes (data.pkl is read there; the index bounds its record within the file).
    keys: each meta storage's record key goes there, by the storage's identity (`_cdata`)."""
    entry = idx.entries.get("data.pkl")
    if entry is None:
        raise CorruptCheckpointError(f"{path}: archive has no data.pkl record")
    with file_bytes(path, at) as (read, _):
        pkl = read(entry.data_off, entry.size)
    if crcs is not None:
        crcs[entry.data_off] = zlib.crc32(pkl)
    sizes = {k: e.size for k, e in idx.entries.items()}
    def meta_storage(key: str, nbytes: int, location: str) -> torch.UntypedStorage:
        s = torch.UntypedStorage(nbytes, device="meta")
        if keys is not None:
            keys[s._cdata] = key
        return s

    return _unpickle_records(path, pkl, sizes, meta_storage, True)


def _unpickle_records(path: str, pkl: bytes, sizes: dict, storage_of, weights_only: bool):
    """data.pkl -> state; storage_of(key, nbytes, location) makes each storage it names once
    the record data/KEY is known to hold exactly its bytes."""
    loaded: dict[str, torch.storage.TypedStorage] = {}

    def persistent_load(pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise CorruptCheckpointError(f"{path}: unexpected persistent id in data.pkl")
        storage_type, key, location, numel = pid[1:]
        dtype = torch.uint8 if storage_type is torch.UntypedStorage else _storage_dtype(storage_type)
        if key not in loaded:
            have = sizes.get(f"data/{key}")
            nbytes = numel * torch._utils._element_size(dtype)
            if have is None or have != nbytes:
                raise CorruptCheckpointError(
                    f"{path}: storage {key} should hold {nbytes} bytes but its record "
                    f"{'is missing' if have is None else f'has {have}'}")
            loaded[key] = torch.storage.TypedStorage(wrap_storage=storage_of(key, nbytes, location),
                                                     dtype=dtype, _internal=True)
        return loaded[key]

    return unpickle(pkl, persistent_load, path, weights_only)


def check_crcs(path: str, idx: ZipIndex, order, crcs, at: int | None = None) -> None:
    """Each record's CRC-32 (crcs, in `order`) against the archive's, then the file's CRC-32 with
    the bytes between the records (headers, directory) read from the file, or from `at` where the
    caller holds the whole file's bytes."""
    for e, c in zip(order, crcs):
        if c != e.crc:
            raise CorruptCheckpointError(
                f"{path}: record {e.name!r} (bytes {e.data_off}..{e.data_off + e.size}) fails its "
                f"CRC-32 check (stored {e.crc:08x}, computed {c:08x})")
    if idx.file_crc is None:
        return
    starts = [idx.base] + [e.data_off + e.size for e in order]  # the gaps between the records
    gaps = [(a, max(0, b - a)) for a, b in zip(starts, [e.data_off for e in order] + [idx.comment_off])]
    if at is not None:  # where the caller holds the file: every gap's CRC there, in one pass
        gap_crcs = range_crcs(path, gaps, at=at)
    else:
        with open(path, "rb") as f:
            gap_crcs = [_crc_range(f, start, start + n, 0) for start, n in gaps]
    file_crc = _native.crc32_concat(0, gap_crcs[0], gaps[0][1])
    for e, c, g, (_, n) in zip(order, crcs, gap_crcs[1:], gaps[1:]):
        file_crc = _native.crc32_concat(_native.crc32_concat(file_crc, c, e.size), g, n)
    if file_crc != idx.file_crc:
        raise CorruptCheckpointError(
            f"{path}: headers or directory are damaged (file CRC-32 {file_crc:08x}, "
            f"recorded {idx.file_crc:08x})")


def _crc_range(f, start: int, end: int, crc: int) -> int:
    f.seek(start)
    while start < end:
        block = f.read(min(end - start, 1 << 20))
        if not block:
            raise CorruptCheckpointError(f"{f.name}: file is shorter than its directory says")
        crc = zlib.crc32(block, crc)
        start += len(block)
    return crc


def _storage_dtype(storage_type) -> torch.dtype:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage deprecation, as torch.load does
        return storage_type.dtype
