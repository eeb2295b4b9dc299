"""The file every tool writes: a 4 KiB header saying which tool wrote the payload and the
tensor's geometry, then the payload.

    [0, 4096)   b"FCKTENS1", u32 length, JSON {tool, dtype, shape, stride, order, nbytes, crc32},
                zero padding
    [4096, ...) the payload, in the writing tool's own encoding (raw bytes, .npy, torch zip)

The payload starts 4096-aligned so the O_DIRECT and GDS tools can write it in place.
Any tool's file is read back through the same interface: the header names the reader.

A tensor comes back with the shape, strides and dtype it was written with (a kernel may
choose another code path for another layout: a transposed matrix handed back contiguous
makes a BLAS compute other bits). `order` says what the payload holds:
  "storage"   the stretch of storage the tensor's elements lie in, as it lies (from its
              first element to its last); the tensor is that stretch seen through
              as_strided(shape, stride). Contiguous, transposed, permuted, channels_last and
              expanded tensors are written so, with no copy;
  "elements"  the elements in row-major order (a slice with gaps, whose stretch is larger
              than its elements); the tensor is rebuilt into memory of its own strides.
A file without `stride` (written before strides were kept) holds a contiguous tensor.
"""
from __future__ import annotations

import json
import os
import struct

import torch

from ..errors import CorruptCheckpointError

MAGIC = b"FCKTENS1"
HEADER = 4096
ORDERS = ("storage", "elements")
DTYPES = {n: getattr(torch, n) for n in (
    "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "uint16",
    "uint32", "uint64", "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2")
    if isinstance(getattr(torch, n, None), torch.dtype)}


def contiguous_strides(shape) -> list[int]:
    """The strides of a row-major tensor of this shape."""
    out, step = [], 1
    for size in reversed(list(shape)):
        out.append(step)
        step *= max(int(size), 1)
    return out[::-1]


def span(shape, stride) -> int:
    """Elements of storage from a tensor's first element to its last (0 when it has none)."""
    if any(int(s) == 0 for s in shape):
        return 0
    return 1 + sum((int(s) - 1) * int(st) for s, st in zip(shape, stride))


def encode(tool: str, t: torch.Tensor, order: str, nbytes: int, crc: int) -> bytes:
    """The header of t's file whose payload (`nbytes` bytes, in `order`) has CRC-32 crc."""
    body = json.dumps({"tool": tool, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                       "stride": list(t.stride()), "order": order, "nbytes": nbytes, "crc32": crc}).encode()
    raw = MAGIC + struct.pack("<I", len(body)) + body
    return raw + bytes(HEADER - len(raw))


def read(path: str) -> dict:
    """The header of a tensor file, validated; CorruptCheckpointError saying what is wrong."""
    try:
        with open(path, "rb") as f:
            raw = f.read(HEADER)
        size = os.path.getsize(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"tensor file {path!r} does not exist") from None
    if len(raw) < 12 or raw[:8] != MAGIC:
        raise CorruptCheckpointError(f"{path}: not a fastckpt tensor file (bad magic or truncated header)")
    (n,) = struct.unpack_from("<I", raw, 8)
    try:
        if n > HEADER - 12:
            raise ValueError("header length out of range")
        h = json.loads(raw[12:12 + n])
        _check_geometry(h)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptCheckpointError(f"{path}: damaged tensor file header ({e})") from None
    if h["tool"] in ("posix", "direct", "kvikio") and size < HEADER + h["nbytes"]:
        raise CorruptCheckpointError(f"{path}: {size} bytes, its header promises {HEADER + h['nbytes']} (truncated?)")
    return h


def _check_geometry(h: dict) -> None:
    """Fills dtype_t, shape, stride, order, numel and span in h, or raises ValueError."""
    h["dtype_t"] = DTYPES[h["dtype"]]
    h["shape"] = [int(x) for x in h["shape"]]
    if any(x < 0 for x in h["shape"]):
        raise ValueError("negative dimension")
    h["stride"] = [int(x) for x in h.get("stride", contiguous_strides(h["shape"]))]
    h["order"] = h.get("order", "elements")
    if len(h["stride"]) != len(h["shape"]) or any(x < 0 for x in h["stride"]):
        raise ValueError(f"strides {h['stride']} do not fit shape {h['shape']}")
    if h["order"] not in ORDERS:
        raise ValueError(f"unknown payload order {h['order']!r}")
    numel = 1
    for x in h["shape"]:
        numel *= x
    h["numel"], h["span"] = numel, span(h["shape"], h["stride"])
    elements = h["span"] if h["order"] == "storage" else numel
    if elements * h["dtype_t"].itemsize != int(h["nbytes"]):
        raise ValueError(f"nbytes does not match dtype, shape and strides ({h['order']} order)")
