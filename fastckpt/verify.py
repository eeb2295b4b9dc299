"""Verification of checkpoint files and directories without loading their state.

Owns reading every byte once (bounded memory: a 64 MiB bounce buffer), checking
each record's CRC-32, the headers/directory (whole-file CRC), the commit record, the
structure a load would build (data.pkl through the restricted unpickler, on meta storages),
and naming what is damaged down to the chunk when the commit record has spans. What a
folder holds (which files, against which records) is fastckpt.tools.folders' to say.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from .commit_info import FileEntry
from .errors import CorruptCheckpointError, UnsafeCheckpointError
from .format import sniff
from .format.reading import range_crcs


@dataclass
class Report:
    ok: bool = True
    lines: list[str] = field(default_factory=list)

    def bad(self, msg: str) -> None:
        self.ok = False
        self.lines.append("CORRUPT " + msg)

    def good(self, msg: str) -> None:
        self.lines.append("ok      " + msg)


def verify_file(path: str, entry: FileEntry | None = None, at: int | None = None) -> str:
    """Raises CorruptCheckpointError naming the damage; returns a one-line summary. An intact
    file whose pickle names a global off the allowlist is not damaged: its line says UNSAFE.
    at: the address where the caller holds the file's bytes (mapped or received, the file's
    whole size): its records, index and structure are read there, the file never opened (a
    child forked meanwhile inherits no descriptor of it)."""
    fmt = sniff(path, at)
    if fmt == "torch":
        from .format.torch_format import check_crcs, check_structure
        from .format.zip_reader import read_index
        idx = read_index(path, at=at)
        order = idx.ordered()
        crcs = range_crcs(path, [(e.data_off, e.size) for e in order], at=at)
        try:
            check_crcs(path, idx, order, crcs, at)
        except CorruptCheckpointError as e:
            raise CorruptCheckpointError(f"{e}{bad_chunk(path, entry, at)}") from None
        file_crc, n = idx.file_crc, len(order)
        if entry is not None and file_crc is None:
            raise CorruptCheckpointError(f"{path}: the commit record names a fastckpt file but its "
                                         "archive has no fastckpt comment (replaced or damaged?)")
        if entry is not None and file_crc != entry.crc32:
            raise CorruptCheckpointError(
                f"{path}: file CRC-32 {file_crc:08x} differs from the commit record ({entry.crc32:08x})")
        note = "" if file_crc is not None else " (written by torch.save: record CRCs only)"
        structure = lambda: check_structure(path, idx, at=at)  # noqa: E731
    else:
        from .format.safetensors_format import check_crcs, check_structure, entry_spans, has_checksums, read_header
        header, data_begin, head = read_header(path, at)
        meta = header.get("__metadata__", {})
        names, spans = entry_spans(header)
        crcs = range_crcs(path, [(data_begin + off, k) for off, k in spans], at=at)
        note, n = "", len(names)
        if has_checksums(path, meta):
            try:
                check_crcs(path, meta, head, names, crcs, [k for _, k in spans], entry.crc32 if entry else None)
            except CorruptCheckpointError as e:
                raise CorruptCheckpointError(f"{e}{bad_chunk(path, entry, at)}") from None
        else:
            note = " (safetensors file without fastckpt checksums: structure checked only)"
        structure = lambda: check_structure(path, header, head)  # noqa: E731
    try:
        structure()
    except UnsafeCheckpointError as e:  # intact, but a load refuses it unless the global is allowlisted
        note += f"; UNSAFE to load as it is: {e}"
    return f"{path}: {n} records, {os.path.getsize(path)} bytes{note}"


def verify_as_recorded(path: str, entry: FileEntry, at: int | None = None) -> None:
    """A file as its commit record's entry describes it: read as one archive (verify_file: every
    record's CRC-32, its structure, its file CRC-32), or, for a layout of many archives (a DCP
    rank file, fastckpt.dcp.layout), its size and whole-file CRC-32, which its entry holds.
    at: where the caller holds the file's bytes (see verify_file)."""
    try:
        verify_file(path, entry, at=at)
    except CorruptCheckpointError:
        size = os.path.getsize(path)
        if size != entry.bytes or range_crcs(path, [(0, size)], at=at)[0] != entry.crc32:
            raise


def bad_chunk(path: str, entry: FileEntry | None, at: int | None = None) -> str:
    if entry is None or not entry.spans:
        return ""
    crcs = range_crcs(path, [(off, n) for _, off, n, _ in entry.spans], at=at)
    for i, ((rec, off, n, want), got) in enumerate(zip(entry.spans, crcs)):
        if want != got:
            name = entry.records[rec] if rec < len(entry.records) else f"#{rec}"
            return f"; first bad chunk: {i} (record {name}, file bytes {off}..{off + n})"
    return ""


def verify_survey(found) -> Report:
    """Every checkpoint `fastckpt ls` lists in found (folders.survey), every byte read. An
    incomplete one is skipped in a folder of many (it is never loaded) and reported when it is
    the one checkpoint asked about; an invalid one is reported as corrupt."""
    from . import progress
    report = Report()
    total = sum(os.path.getsize(p) for e in found.entries for p, _ in e.checks if os.path.isfile(p))
    with found.loading(), progress.shown(total, "verify") as bar:
        for e in found.entries:
            if e.status == "incomplete" and found.single:
                report.bad(f"{e.path}: incomplete ({e.detail}): it cannot be loaded")
                continue
            if e.status == "incomplete":
                report.lines.append(f"skip    {e.path}: incomplete ({e.detail})")
                continue
            if e.status == "invalid":
                report.bad(f"{e.path}: {e.detail}")
                continue
            for path, entry in e.checks:
                before = bar.n if bar is not None else 0
                try:
                    report.good(found.check(path, entry) + (" (foreign: no fastckpt record)"
                                                            if e.status == "foreign" else ""))
                except (CorruptCheckpointError, OSError) as err:
                    report.bad(str(err))
                if bar is not None:  # the whole file counted once, however much of it its check reported
                    bar.n = before + (os.path.getsize(path) if os.path.isfile(path) else 0)
                    bar.refresh()
    for e in found.temporaries:
        report.lines.append(f"skip    {e.path}: not a checkpoint ({e.detail})")
    return report


def verify_one(path: str, entry: FileEntry | None) -> str:
    """One file of a checkpoint, every byte read (a pool pointer: the version it points to)."""
    from .pmem.pointer import is_pool_pointer
    if is_pool_pointer(path):
        from .pmem.commands import verify_pointer
        return verify_pointer(path)
    if entry is not None and os.path.getsize(path) != entry.bytes:
        raise CorruptCheckpointError(f"{path}: {os.path.getsize(path)} bytes, its commit record says {entry.bytes}")
    return verify_file(path, entry)
