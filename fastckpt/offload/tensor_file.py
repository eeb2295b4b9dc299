"""The file every tool writes: a 4 KiB header saying which tool wrote the payload, then the payload.

    [0, 4096)   b"FCKTENS1", u32 length, JSON {tool, dtype, shape, nbytes, crc32}, zero padding
    [4096, ...) the payload, in the writing tool's own encoding (raw bytes, .npy, torch zip)

The payload starts 4096-aligned so the O_DIRECT and GDS tools can write it in place. Any
tool's file is read back through the same interface: the header names the reader.
"""
from __future__ import annotations

import json
import os
import struct

import torch

from ..errors import CorruptCheckpointError

MAGIC = b"FCKTENS1"
HEADER = 4096
DTYPES = {n: getattr(torch, n) for n in (
    "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "uint16",
    "uint32", "uint64", "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2")
    if isinstance(getattr(torch, n, None), torch.dtype)}


def encode(tool: str, t: torch.Tensor, crc: int) -> bytes:
    body = json.dumps({"tool": tool, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                       "nbytes": t.numel() * t.element_size(), "crc32": crc}).encode()
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
        h["dtype_t"] = DTYPES[h["dtype"]]
        h["shape"] = [int(x) for x in h["shape"]]
        numel = 1
        for x in h["shape"]:
            if x < 0:
                raise ValueError("negative dimension")
            numel *= x
        if numel * h["dtype_t"].itemsize != int(h["nbytes"]):
            raise ValueError("nbytes does not match dtype and shape")
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptCheckpointError(f"{path}: damaged tensor file header ({e})") from None
    if h["tool"] in ("posix", "direct", "kvikio") and size < HEADER + h["nbytes"]:
        raise CorruptCheckpointError(f"{path}: {size} bytes, its header promises {HEADER + h['nbytes']} (truncated?)")
    return h
