"""fastckpt.save(..., tool=...): a checkpoint file written record by record with Fastensor's tools.

Owns writing a FilePlan (the torch-zip or safetensors layout, unchanged: fastckpt.load and
torch.load read the result as any other) where each storage's bytes go to their region
of the file through the tool a TensorIO chooses for that size: "auto" learns per size from
measured write times (AwareDic, WDic), a tool name uses that tool alone. Only the tools
that write raw bytes at an offset can place a record inside one file: posix, direct (a
4096-aligned record), kvikio (a CUDA storage). A record the named tool cannot write (an
unaligned one under "direct": safetensors packs entries under 4 KiB; a CPU one under "kvikio")
is written with posix: write_plan counts it per tool, and the first time each happens in a
process a warning says so (say_fallback, once the file is in place). The file is fdatasynced before save renames it.
"""
from __future__ import annotations

import os
import time
import warnings

import torch

from .. import _native
from ..errors import ConfigError
from ..format.plan import ALIGN, FilePlan
from .adaptive import TensorIO
from .io_tools import crc_of, kvikio_or_why

REGION_TOOLS = ("posix", "direct", "kvikio")
_auto: TensorIO | None = None  # one learner per process, so every save teaches the next
_said: set[str] = set()  # the forced tools whose fallback to posix was warned about in this process
WHY_NOT = {"direct": "not 4096-aligned in the file (format='safetensors' packs entries under 4 KiB)",
           "kvikio": "CPU storages (kvikio writes CUDA ones)"}


def io_for(tool) -> TensorIO:
    """The TensorIO behind save(tool=...): "auto", a region tool's name, or a TensorIO."""
    global _auto
    if isinstance(tool, TensorIO):
        return tool
    if tool == "auto":
        if _auto is None:
            _auto = TensorIO(mode="aware", aware="w", tools=REGION_TOOLS)
        return _auto
    if tool not in REGION_TOOLS:
        raise ConfigError(f"save(tool={tool!r}): a checkpoint's records are written in place by one of "
                          f"{', '.join(REGION_TOOLS)}, or tool='auto' chooses per size")
    return TensorIO(mode="tool", tool=tool, tools=REGION_TOOLS)


def _bytes_of(storage: torch.UntypedStorage, nbytes: int) -> torch.Tensor:
    t = torch.empty(0, dtype=torch.uint8, device=storage.device)
    return t.set_(storage, 0, (nbytes,))


def _write_region(tool: str, path: str, off: int, b: torch.Tensor, host: torch.Tensor) -> None:
    """b's bytes at off: kvikio from b (on the GPU), posix / direct from host (b's host copy)."""
    if tool == "kvikio":
        kvikio = kvikio_or_why()[0]
        with kvikio.CuFile(path, "r+") as f:
            f.write(b, file_offset=off)
        return
    (_native.write_direct if tool == "direct" else _native.write_buffered)(path, off, host.data_ptr(), host.numel())


def write_plan(plan: FilePlan, path: str, io: TensorIO) -> dict[str, int]:
    """Writes the whole file at path durably; returns how many records each tool wrote."""
    directory = os.path.dirname(os.path.abspath(path))
    with open(path, "wb"):
        pass
    crcs, used = [0] * len(plan.records), {}
    for i in sorted(range(len(plan.records)), key=lambda i: plan.records[i].file_off):
        rec = plan.records[i]  # ascending offsets: a direct write's cut of the file stays behind it
        b = _bytes_of(rec.storage, rec.nbytes)
        allowed = tuple(t for t in REGION_TOOLS if (t != "direct" or rec.file_off % ALIGN == 0)
                        and (t != "kvikio" or b.is_cuda))
        if io.mode == "tool" and io.tool not in allowed:
            tool = "posix"  # e.g. a small unaligned safetensors entry under tool="direct"
        else:
            tool = io.choice(rec.nbytes, directory, b.is_cuda, only=allowed)
        t0 = time.perf_counter()
        host = b.cpu() if b.is_cuda else b  # one copy to the host, for the CRC and a host tool
        if rec.nbytes:
            _write_region(tool, path, rec.file_off, b, host)
        io.record("w", rec.nbytes, tool, time.perf_counter() - t0)
        crcs[i] = crc_of(host)
        used[tool] = used.get(tool, 0) + 1
    blobs, _ = plan.finish(crcs)
    fd = os.open(path, os.O_WRONLY)
    try:
        for off, data in blobs:
            os.pwrite(fd, data, off)
        os.ftruncate(fd, plan.file_size)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    return used


def say_fallback(io: TensorIO, used: dict[str, int], stacklevel: int) -> None:
    """Warns (once per tool and process) when a named tool left records to posix; save() calls it
    once the file is in place, so a warning turned into an error cannot undo a finished save."""
    fell_back = sum(n for t, n in used.items() if t != io.tool) if io.mode == "tool" else 0
    if fell_back and io.tool not in _said:
        _said.add(io.tool)
        warnings.warn(f"fastckpt.save(tool={io.tool!r}): {fell_back} of {sum(used.values())} records were "
                      f"{WHY_NOT.get(io.tool, 'not writable by it')} and were written with posix; the result's "
                      "tools says which tool wrote how many (warned once per process)", stacklevel=stacklevel + 1)
