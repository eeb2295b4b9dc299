"""format="safetensors": valid safetensors files, planned up front.

Owns the layout (8-byte header length, JSON header padded with spaces so data
starts 4096-aligned, tensors packed with explicit pad entries and no holes,
the file ending at its last byte), the JSON skeleton of the non-tensor state
in __metadata__, per-entry CRC-32s in __metadata__, and the validating reader.
A tensor that owns its whole storage is stored under its own name and dtype;
storages shared by views (or of dtypes safetensors lacks) are stored once as
bytes and the skeleton records the views, so sharing survives the round trip.
"""
from __future__ import annotations

import json
import struct
import zlib

import torch

from .. import _native
from ..errors import ConfigError, CorruptCheckpointError
from . import skeleton
from .plan import ALIGN, DataRecord, FilePlan
from .reading import file_bytes, read_records
from .views import check_view

ST_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL", torch.complex64: "C64",
    torch.uint16: "U16", torch.uint32: "U32", torch.uint64: "U64",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
    torch.float8_e4m3fnuz: "F8_E4M3FNUZ", torch.float8_e5m2fnuz: "F8_E5M2FNUZ",
}
FROM_ST = {v: k for k, v in ST_DTYPES.items()}
MAX_HEADER = 100 << 20
CRC_KEY, RECORDS_KEY, SKELETON_KEY = "fastckpt.crc32", "fastckpt.records", "fastckpt.skeleton"
PAD_BELOW = 4096  # entries at least this large start 4096-aligned


def plan_safetensors(state, allow_pickle: bool = False, plain: bool = False) -> FilePlan:
    """plain: a file for other tools (`fastckpt export`): exactly the state's tensors, each under
    its dotted path (`state_dict.layer.weight`), no pad entries and no shared storages (a view
    is stored as a copy of what it sees; a complex128 tensor, a dtype safetensors lacks, as its
    float64 (real, imag) pairs, as torch.view_as_real gives them); the skeleton and CRCs stay in
    __metadata__, which safetensors' loaders pass over."""
    users: dict[int, list[torch.Tensor]] = {}
    storages: dict[int, torch.UntypedStorage] = {}

    def collect(t: torch.Tensor, path: str) -> dict:
        s = t.untyped_storage()
        if t.device.type == "meta":
            raise ValueError("cannot checkpoint tensors on the meta device (they hold no data)")
        storages.setdefault(s._cdata, s)
        users.setdefault(s._cdata, []).append(t)
        return {"path": path}

    skeleton.encode(state, collect, allow_pickle)  # dry run: who uses which storage
    entries: list[tuple[str, str, list[int], torch.UntypedStorage]] = []
    names: dict[int, str] = {}
    used: set[str] = set()

    def on_tensor(t: torch.Tensor, path: str) -> dict:
        s = t.untyped_storage()
        ref = {"requires_grad": t.requires_grad, "param": isinstance(t, torch.nn.Parameter)}
        whole = (len(users[s._cdata]) == 1 and t.storage_offset() == 0 and t.is_contiguous()
                 and t.numel() * t.element_size() == s.nbytes() and t.dtype in ST_DTYPES)
        if plain and t.is_complex() and t.dtype not in ST_DTYPES:  # complex128: its (real, imag) pairs
            pairs = torch.view_as_real(t.detach().resolve_conj()).contiguous()
            name = _unique(path or "tensor", used)
            entries.append((name, ST_DTYPES[pairs.dtype], list(pairs.shape), pairs.untyped_storage()))
            return {**ref, "storage": name, "dtype": str(t.dtype).removeprefix("torch."), "offset": 0,
                    "size": list(t.shape), "stride": list(torch.empty(t.shape).stride())}
        if plain and not whole:
            if t.dtype not in ST_DTYPES:
                raise ConfigError(f"safetensors has no dtype {t.dtype} (the tensor at {path or '<root>'!r}); "
                                  "export it --to torch")
            t = t.detach().clone(memory_format=torch.contiguous_format)
            s, whole = t.untyped_storage(), True
        if whole:
            name = _unique(path or "tensor", used)
            entries.append((name, ST_DTYPES[t.dtype], list(t.shape), s))
            return {**ref, "entry": name}
        if s._cdata not in names:
            names[s._cdata] = _unique(f"__storage__.{len(names)}", used)
            entries.append((names[s._cdata], "U8", [s.nbytes()], s))
        return {**ref, "storage": names[s._cdata], "dtype": str(t.dtype).removeprefix("torch."),
                "offset": t.storage_offset(), "size": list(t.shape), "stride": list(t.stride())}

    skel = json.dumps(skeleton.encode(state, on_tensor, allow_pickle), separators=(",", ":"))
    return _layout(entries, skel, pad=not plain)


def _unique(name: str, used: set[str]) -> str:
    base, i = name, 1
    while name in used or name.startswith("__pad__"):
        name, i = f"{base}#{i}", i + 1
    used.add(name)
    return name


def _layout(entries, skel: str, pad: bool = True) -> FilePlan:
    placed, cursor, pads = [], 0, 0
    for name, dtype, shape, s in entries:
        nbytes = s.nbytes()
        if pad and nbytes >= PAD_BELOW and cursor % ALIGN:
            gap = ALIGN - cursor % ALIGN
            placed.append((f"__pad__.{pads}", "U8", [gap], None, cursor, gap))
            pads, cursor = pads + 1, cursor + gap
        placed.append((name, dtype, shape, s, cursor, nbytes))
        cursor += nbytes
    meta = {SKELETON_KEY: skel, CRC_KEY: "0" * 8, RECORDS_KEY: "0" * (8 * len(placed)),
            "format": "pt"}
    header = {"__metadata__": meta}
    for name, dtype, shape, _, off, n in placed:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
    text = json.dumps(header, separators=(",", ":"))
    hlen = -(-(8 + len(text.encode())) // ALIGN) * ALIGN - 8
    data_begin = 8 + hlen
    records = []
    zero = torch.zeros(ALIGN, dtype=torch.uint8).untyped_storage()  # source of every pad entry
    for name, _, _, s, off, n in placed:
        records.append(DataRecord(name, data_begin + off, n, s if s is not None else zero))
    file_size = data_begin + cursor

    def finish(crcs: list[int]) -> tuple[list[tuple[int, bytes]], int]:
        meta[RECORDS_KEY] = "".join(f"{c:08x}" for c in crcs)
        meta[CRC_KEY] = "0" * 8
        meta[CRC_KEY] = f"{_header_crc(json.dumps(header, separators=(',', ':')), hlen):08x}"
        blob = _header_bytes(json.dumps(header, separators=(",", ":")), hlen)
        file_crc = zlib.crc32(blob)
        for r, c in zip(records, crcs):
            file_crc = _native.crc32_concat(file_crc, c, r.nbytes)
        return [(0, blob)], file_crc

    return FilePlan("safetensors", records, data_begin, data_begin + cursor, file_size, finish)


def _header_bytes(text: str, hlen: int) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", hlen) + raw + b" " * (hlen - len(raw))


def _header_crc(text_with_zero_crc: str, hlen: int) -> int:
    return zlib.crc32(_header_bytes(text_with_zero_crc, hlen))


def _bad(path: str, why: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"{path}: not a valid safetensors checkpoint ({why})")


def read_header(path: str, at: int | None = None) -> tuple[dict, int, bytes]:
    """Validates the header against the file size before anything is allocated. at: where the
    caller holds the whole file's bytes (read there, the file not opened)."""
    with file_bytes(path, at) as (read, size):
        return _header_of(path, size, read)


def _header_of(path: str, size: int, read) -> tuple[dict, int, bytes]:
    """read_header's checks, read(offset, n) giving the file's bytes."""
    head = read(0, min(8, size))
    if len(head) < 8:
        raise _bad(path, "shorter than 8 bytes (truncated?)")
    (hlen,) = struct.unpack("<Q", head)
    if hlen > MAX_HEADER or 8 + hlen > size:
        raise _bad(path, f"header length {hlen} does not fit a {size}-byte file")
    return parse_header(head + read(8, hlen), size, path)


def parse_header(head: bytes, size: int, where) -> tuple[dict, int, bytes]:
    """The one validator of a header (8-byte length + JSON) of an image of `size` bytes:
    every entry well-formed, entries tiling the data section with no hole or overlap, and
    the data ending where the image does. Returns (header, data start, header bytes)."""
    if len(head) < 8:
        raise _bad(where, "shorter than 8 bytes (truncated?)")
    (hlen,) = struct.unpack_from("<Q", head)
    if hlen > MAX_HEADER or 8 + hlen > size or len(head) < 8 + hlen:
        raise _bad(where, f"header length {hlen} does not fit a {size}-byte image")
    head = head[:8 + hlen]
    try:
        header = json.loads(head[8:])
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise _bad(where, f"header is not JSON (or nests too deep): {e}") from None
    if not isinstance(header, dict):
        raise _bad(where, "header is not a JSON object")
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise _bad(where, "__metadata__ must map strings to strings")
            continue
        try:
            dtype = FROM_ST[info["dtype"]]
            shape = [int(x) for x in info["shape"]]
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError, OverflowError):
            raise _bad(where, f"entry {name!r} is malformed") from None
        numel = 1
        for x in shape:
            if x < 0:
                raise _bad(where, f"entry {name!r} has a negative dimension")
            numel *= x
        if end - begin != numel * torch.empty((), dtype=dtype).element_size() or begin > end:
            raise _bad(where, f"entry {name!r}: offsets do not match its shape and dtype")
        spans.append((begin, end, name))
    spans.sort()
    cursor = 0
    for begin, end, name in spans:
        if begin != cursor:
            raise _bad(where, f"entry {name!r} leaves a hole or overlaps (at byte {begin})")
        cursor = end
    if 8 + hlen + cursor != size:
        raise _bad(where, f"data ends at {8 + hlen + cursor} but the image has {size} bytes")
    return header, 8 + hlen, head


def entry_spans(header: dict) -> tuple[list[str], list[tuple[int, int]]]:
    """Entry names in data order, and each one's (offset in the data section, length)."""
    names = sorted((n for n in header if n != "__metadata__"), key=lambda n: header[n]["data_offsets"][0])
    return names, [(header[n]["data_offsets"][0], header[n]["data_offsets"][1] - header[n]["data_offsets"][0])
                   for n in names]


def read_safetensors(path: str, map_location=None, verify: bool = True, weights_only: bool = True,
                     threads: int | None = None, expect_crc: int | None = None, mmap: bool | None = None):
    header, data_begin, head_bytes = read_header(path)
    names, spans = entry_spans(header)
    data, crcs = read_records(path, [(data_begin + o, n) for o, n in spans], verify,
                              True if mmap is None else mmap, threads)
    return assemble(path, header, head_bytes, names, data, crcs, verify, map_location, weights_only, expect_crc)


def assemble(where, header: dict, head_bytes: bytes, names: list[str], data: list[torch.Tensor], crcs,
             verify: bool, map_location, weights_only: bool, expect_crc: int | None):
    """The state from validated entries' bytes (uint8 tensors, in data order): CRCs checked
    (when verify and the image is ours), views and dtypes restored, the skeleton rebuilt."""
    meta = header.get("__metadata__", {})
    bufs = dict(zip(names, data))
    if verify and has_checksums(where, meta):
        check_crcs(where, meta, head_bytes, names, crcs, [bufs[n].numel() for n in names], expect_crc)
    out = {}
    for n in names:
        info = header[n]
        out[n] = bufs[n].view(FROM_ST[info["dtype"]]).reshape(info["shape"])
    device = None if map_location is None else torch.device(str(map_location))
    if SKELETON_KEY not in meta:
        return {n: t.to(device) if device else t for n, t in out.items() if not n.startswith("__pad__")}
    try:
        skel = json.loads(meta[SKELETON_KEY])
    except (ValueError, RecursionError) as e:
        raise CorruptCheckpointError(f"{where}: safetensors skeleton is damaged: {e}") from None
    return _rebuild(skel, out, device, weights_only)


def check_structure(path: str, header: dict, head_bytes: bytes) -> None:
    """Everything a load checks but the bytes: the state is rebuilt on meta-device entries
    (skeleton, views inside their storages, pickled values through the restricted unpickler)."""
    names, spans = entry_spans(header)
    data = [torch.empty(n, dtype=torch.uint8, device="meta") for _, n in spans]
    assemble(path, header, head_bytes, names, data, None, False, None, True, None)


def has_checksums(path, meta: dict) -> bool:
    """True for a file fastckpt wrote (all three of its keys), False for a plain safetensors
    file (none); a damaged key name leaves some but not all, which is corruption."""
    ours = [k for k in (CRC_KEY, RECORDS_KEY, SKELETON_KEY) if k in meta]
    if ours and len(ours) != 3:
        raise _bad(path, "the header is damaged (a fastckpt metadata key is missing)")
    return bool(ours)


def check_crcs(path, meta, head_bytes, names, crcs, sizes, expect_crc) -> None:
    stored = meta.get(RECORDS_KEY, "")
    if len(stored) != 8 * len(names):
        raise _bad(path, "per-entry CRC list does not match the entries")
    for i, (n, c) in enumerate(zip(names, crcs)):
        if stored[8 * i:8 * i + 8] != f"{c:08x}":  # as written: a case flip is damage too
            raise CorruptCheckpointError(
                f"{path}: entry {n!r} fails its CRC-32 check (stored {stored[8*i:8*i+8]}, computed {c:08x})")
    key = f'"{CRC_KEY}":"{meta[CRC_KEY]}"'.encode()
    if head_bytes.count(key) != 1:
        raise _bad(path, "header CRC field is damaged")
    zeroed = head_bytes.replace(key, f'"{CRC_KEY}":"{"0" * 8}"'.encode())
    if f"{zlib.crc32(zeroed):08x}" != meta[CRC_KEY]:
        raise CorruptCheckpointError(f"{path}: the header is damaged (header CRC-32 mismatch)")
    if expect_crc is not None:
        file_crc = zlib.crc32(head_bytes)
        for n, c in zip(sizes, crcs):
            file_crc = _native.crc32_concat(file_crc, c, n)
        if file_crc != expect_crc:
            raise CorruptCheckpointError(f"{path}: file CRC-32 differs from its commit record")


def _rebuild(skel, entries: dict[str, torch.Tensor], device, weights_only: bool):
    moved: dict[str, torch.Tensor] = {}

    def entry(name: str) -> torch.Tensor:
        """An entry on the device asked for, moved once: the views of one storage stay views of
        one storage there, with their strides (a view moved on its own would come back
        contiguous, in memory of its own)."""
        if device is None:
            return entries[name]
        if name not in moved:
            moved[name] = entries[name].to(device)
        return moved[name]

    def on_tensor(ref: dict) -> torch.Tensor:
        if "entry" in ref:
            t = entry(ref["entry"])
        else:
            raw = entry(ref["storage"])
            dtype = getattr(torch, ref["dtype"])
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"unknown dtype {ref['dtype']!r}")
            storage = raw.untyped_storage()
            check_view(storage.nbytes(), dtype.itemsize, ref["offset"], ref["size"], ref["stride"], "safetensors skeleton")
            t = torch.empty(0, dtype=dtype, device=storage.device).set_(storage, ref["offset"], ref["size"], ref["stride"])
        if ref.get("param"):
            return torch.nn.Parameter(t, requires_grad=ref["requires_grad"])
        return t.requires_grad_(ref["requires_grad"]) if t.is_floating_point() or t.is_complex() else t
    try:
        return skeleton.decode(skel, on_tensor, weights_only)
    except (KeyError, ValueError, TypeError, AttributeError, RuntimeError, OverflowError, RecursionError) as e:
        raise CorruptCheckpointError(f"safetensors skeleton is damaged: {e}") from None
