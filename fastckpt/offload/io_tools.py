"""The tensor I/O tools Fastensor chooses among, each usable alone (SpecificTool).

  posix   buffered pwrite/pread from the native core (through the page cache)
  direct  O_DIRECT from/to an aligned bounce buffer in the native core (bypasses the cache)
  numpy   numpy.save of the payload's bytes; read back by numpy.lib.format's .npy header reader
          (one thread at a time: see _read_npy), the bytes straight into the tensor
  torch   torch.save / torch.load(weights_only=True) of the payload's bytes
  kvikio  kvikio.CuFile (GPU Direct Storage, or kvikio's compat mode) for CUDA tensors

Each writes the same tensor file (tensor_file.py: a header naming the tool and the
tensor's geometry, then its payload), so any file is read back through read_tensor whoever
wrote it, with the shape, strides and dtype it was written with (payload_of, rebuild).
A tool that cannot run here (no CUDA or kvikio; O_DIRECT refused by the directory's filesystem) is
reported by available_tools() with its reason, and never chosen.
"""
from __future__ import annotations

import io
import logging
import os
import threading

import numpy as np
import torch

from .. import _native
from ..errors import CorruptCheckpointError
from ..format import device_crc
from . import tensor_file as tf

log = logging.getLogger("fastckpt")
TOOLS = ("posix", "direct", "numpy", "torch", "kvikio")


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


def payload_of(t: torch.Tensor) -> tuple[torch.Tensor, str]:
    """(the flat bytes a tool writes for t, on t's device; their order, as tensor_file says).
    The stretch of storage t's elements lie in, as it lies and without a copy, when it holds
    no more elements than t (contiguous, transposed, permuted, channels_last, expanded);
    else (a slice with gaps) t's elements in row-major order."""
    t = t.detach()
    n = tf.span(t.shape, t.stride())
    if n == 0:
        return torch.empty(0, dtype=torch.uint8, device=t.device), "storage"
    if n <= t.numel():
        return t.as_strided((n,), (1,), t.storage_offset()).view(torch.uint8), "storage"
    return t.contiguous().view(-1).view(torch.uint8), "elements"


def rebuild(b: torch.Tensor, h: dict, path: str) -> torch.Tensor:
    """The tensor the payload bytes b of the file at path hold (on b's device), with the file's
    shape, strides and dtype (h: tensor_file.read's header)."""
    shape, stride, dtype = h["shape"], h["stride"], h["dtype_t"]
    if h["span"] == 0:
        return torch.empty_strided(shape, stride, dtype=dtype, device=b.device)
    flat = b.view(dtype)
    if h["order"] == "storage":
        return flat.as_strided(shape, stride)
    if stride == tf.contiguous_strides(shape):
        return flat.view(shape)
    try:  # a slice with gaps: memory of its own strides, its elements copied in
        out = torch.empty_strided(shape, stride, dtype=dtype, device=b.device)
    except (RuntimeError, MemoryError) as e:
        raise CorruptCheckpointError(f"{path}: no room for a tensor of shape {shape} and strides {stride} "
                                     f"({str(e).splitlines()[0]})") from None
    return out.copy_(flat.view(shape))


def crc_of(b: torch.Tensor) -> int:
    """CRC-32 of a flat uint8 host tensor (0 when empty)."""
    return _native.crc32(b.data_ptr(), b.numel()) if b.numel() else 0


def _write_header(path: str, tool: str, t: torch.Tensor, order: str, b: torch.Tensor, crc: int) -> None:
    with open(path, "wb") as f:
        f.write(tf.encode(tool, t, order, b.numel(), crc))


def write_tensor(t: torch.Tensor, path: str, tool: str) -> None:
    """Writes t to path with one tool (the file is replaced); read_tensor gives back its shape,
    strides, dtype and values."""
    if tool == "kvikio":
        return _write_kvikio(t, path)
    b, order = payload_of(t)
    b = b.cpu()  # one copy of the payload to the host for a CUDA tensor; none for a host one
    crc = crc_of(b)
    _write_header(path, tool, t, order, b, crc)
    if tool == "posix":
        _native.write_buffered(path, tf.HEADER, b.data_ptr(), b.numel())
    elif tool == "direct":
        _native.write_direct(path, tf.HEADER, b.data_ptr(), b.numel())
    elif tool == "numpy":
        with open(path, "r+b") as f:
            f.seek(tf.HEADER)
            np.save(f, b.numpy(), allow_pickle=False)
    elif tool == "torch":
        buf = io.BytesIO()  # torch.save writes a view's whole storage: the payload alone, then
        torch.save(b if b.untyped_storage().nbytes() == b.numel() else b.clone(), buf)
        with open(path, "r+b") as f:
            f.seek(tf.HEADER)
            f.write(buf.getbuffer())
    else:
        raise ValueError(f"unknown tool {tool!r}; choose one of {', '.join(TOOLS)}")


def read_tensor(path: str, device=None, verify: bool = True, header: dict | None = None) -> torch.Tensor:
    """The tensor in path, read by the tool its header names (tf.read's result, when the caller
    has it already), with the shape, strides and dtype it was written with; CRC-checked when
    verify."""
    h = header if header is not None else tf.read(path)
    tool, n = h["tool"], h["nbytes"]
    if tool == "kvikio":
        return _read_kvikio(path, h, device, verify)
    if tool in ("posix", "direct"):
        b = torch.empty(n, dtype=torch.uint8)
        if n:
            (_native.read_direct if tool == "direct" else _native.read_buffered)(path, tf.HEADER, b.data_ptr(), n)
    elif tool == "numpy":
        b = _read_npy(path, n)
    elif tool == "torch":
        with open(path, "rb") as f:
            f.seek(tf.HEADER)
            data = f.read()
        try:
            b = _flat_bytes(torch.load(io.BytesIO(data), weights_only=True))
        except Exception as e:  # noqa: BLE001 - any failure of the payload is corruption
            raise CorruptCheckpointError(f"{path}: torch payload unreadable ({e})") from None
    else:
        raise CorruptCheckpointError(f"{path}: written by unknown tool {tool!r}")
    if b.numel() != n:
        raise CorruptCheckpointError(f"{path}: payload has {b.numel()} bytes, header says {n}")
    if verify and crc_of(b) != h["crc32"]:
        raise CorruptCheckpointError(f"{path}: tensor data fails its CRC-32 check")
    return rebuild(b.to(device) if device is not None else b, h, path)


# numpy parses a .npy header with ast.literal_eval, and CPython 3.11 cannot build an AST on two
# threads at once: the constructor's recursion count is the interpreter's, not the thread's, so a
# thread switch inside one (a collection running a finalizer) fails the other with "SystemError:
# AST constructor recursion depth mismatch" (seen in CI on 3.11.7). Offload reads from several
# I/O threads, so a header is parsed by one thread at a time; the bytes after it are read outside.
_NPY_HEADER = threading.Lock()
_NPY_VERSIONS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _read_npy(path: str, n: int) -> torch.Tensor:
    """The n-byte payload of a file the numpy tool wrote: numpy.save's one flat uint8 array after
    the tensor file's header (tensor_file.py); CorruptCheckpointError for anything else."""
    with open(path, "rb") as f:
        f.seek(tf.HEADER)
        try:
            with _NPY_HEADER:
                version = np.lib.format.read_magic(f)
                if version not in _NPY_VERSIONS:
                    raise ValueError(f"format version {version} is not one numpy.save writes for bytes")
                shape, _, dtype = _NPY_VERSIONS[version](f)
        except (ValueError, EOFError, OSError, SyntaxError) as e:
            raise CorruptCheckpointError(f"{path}: numpy payload unreadable ({e})") from None
        if dtype != np.uint8 or tuple(shape) != (n,):
            raise CorruptCheckpointError(f"{path}: numpy payload is an array of {dtype} of shape {shape}, not the "
                                         f"{n} flat bytes the file's header says")
        b = torch.empty(n, dtype=torch.uint8)
        got = f.readinto(b.numpy()) if n else 0
    if got != n:
        raise CorruptCheckpointError(f"{path}: numpy payload is cut short: {got} of {n} bytes")
    return b


def kvikio_or_why():
    """(the kvikio module, None) where GDS I/O can run here, else (None, why not)."""
    from ..write.gds import kvikio_mode
    if not torch.cuda.is_available():
        return None, "no CUDA device"
    if kvikio_mode() is None:
        return None, "kvikio is not installed or has no usable driver"
    import kvikio
    return kvikio, None


def _write_kvikio(t: torch.Tensor, path: str) -> None:
    kvikio, why = kvikio_or_why()
    if kvikio is None:
        raise OSError(f"tool 'kvikio' is unavailable here: {why}")
    b, order = payload_of(t)
    crc = device_crc.crc32_where_it_is(b)
    _write_header(path, "kvikio", t, order, b, crc)
    if b.numel():
        with kvikio.CuFile(path, "r+") as f:
            f.write(b, file_offset=tf.HEADER)


def _read_kvikio(path: str, h: dict, device, verify: bool) -> torch.Tensor:
    kvikio, why = kvikio_or_why()
    if kvikio is None:  # the bytes are raw: any host can still read them
        b = torch.empty(h["nbytes"], dtype=torch.uint8)
        if h["nbytes"]:
            _native.read_buffered(path, tf.HEADER, b.data_ptr(), h["nbytes"])
    else:
        b = torch.empty(h["nbytes"], dtype=torch.uint8, device=device if device is not None else "cuda")
        if h["nbytes"]:
            with kvikio.CuFile(path, "r") as f:
                f.read(b, file_offset=tf.HEADER)
    if verify and device_crc.crc32_where_it_is(b) != h["crc32"]:
        raise CorruptCheckpointError(f"{path}: tensor data fails its CRC-32 check")
    return rebuild(b.to(device) if device is not None else b, h, path)


def available_tools(directory: str, cuda: bool = False) -> dict[str, str | None]:
    """tool -> None when it can write into directory (for CUDA tensors, with cuda=True),
    else the reason it cannot; probed once by writing a small file."""
    out: dict[str, str | None] = {}
    probe = torch.arange(1024, dtype=torch.int32)
    for tool in TOOLS:
        if tool == "kvikio":
            out[tool] = (kvikio_or_why()[1] if cuda else "for CUDA tensors only")
            continue
        # a name of its own per thread: the backward thread and the I/O threads may probe at once
        path = os.path.join(directory, f".fastckpt-probe-{tool}-{os.getpid()}-{threading.get_ident()}")
        try:
            write_tensor(probe, path, tool)
            ok = torch.equal(read_tensor(path), probe)
            out[tool] = None if ok else "read back differs"
        except OSError as e:
            out[tool] = f"{type(e).__name__}: {e}"
        finally:
            if os.path.exists(path):
                os.unlink(path)
        if out[tool]:
            log.info("fastckpt offload: tool %r unavailable in %s: %s", tool, directory, out[tool])
    return out
