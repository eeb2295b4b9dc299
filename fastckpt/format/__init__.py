"""On-disk formats: torch's zip archive (default) and safetensors, planned up front.

plan_file(state, fmt) -> FilePlan for the writer; load_file(path) -> state,
picking the reader from the file's own bytes (zip or safetensors); with into= (a
fitting.Destination), a torch-format file's whole storages that destination tensors hold are
read straight into them (fitting.py: the walk over both structures).
"""
from __future__ import annotations

import os

from .. import progress
from ..errors import ConfigError
from .plan import FilePlan

FORMATS = ("torch", "safetensors")


def plan_file(state, fmt: str = "torch", allow_pickle: bool = False, plain: bool = False) -> FilePlan:
    """allow_pickle (safetensors): values JSON cannot hold are pickled into the skeleton;
    loading them goes through the restricted unpickler unless weights_only=False.
    plain (safetensors): a file for other tools, exactly the state's tensors (an export)."""
    if fmt == "torch":
        from .torch_format import plan_torch
        return plan_torch(state)
    if fmt == "safetensors":
        from .safetensors_format import plan_safetensors
        return plan_safetensors(state, allow_pickle, plain)
    raise ConfigError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")


def sniff(path: str, at: int | None = None) -> str:
    """"torch" or "safetensors", from the file's first bytes (at: where the caller holds the
    whole file's bytes: read there, the file not opened)."""
    from ..fsutil import read_regular
    from .reading import file_bytes
    try:
        if at is None:
            head = read_regular(path, 9)
        else:
            with file_bytes(path, at) as (read, size):
                head = read(0, min(9, size))
    except FileNotFoundError:
        raise FileNotFoundError(f"checkpoint file {path!r} does not exist") from None
    except IsADirectoryError:
        raise IsADirectoryError(f"{path!r} is a directory; pass a checkpoint file "
                                "(or use fastckpt.Checkpointer(root).load())") from None
    if head[:4] == b"PK\x03\x04":
        return "torch"
    if len(head) == 9 and head[8:9] == b"{":
        return "safetensors"
    from ..errors import CorruptCheckpointError
    raise CorruptCheckpointError(f"{path}: neither a torch zip archive nor a safetensors file")


def load_file(path: str, map_location=None, verify: bool = True, weights_only: bool = True,
              expect_crc: int | None = None, mmap: bool | None = None, into=None):
    """mmap=True: tensors are views of a private (copy-on-write) mapping of the file; mmap=None
    too, but a verified load of a torch-format file mostly not in the page cache reads it instead
    (fastckpt.format.reading.read_records); mmap=False: copies into anonymous memory.
    into (a fitting.Destination): tensors the caller loads the state into; a torch-format file
    reads what fits straight into them (torch_format.read_torch), the caller copies the rest.
    A file of a GiB or more shows a progress bar on a terminal (fastckpt.progress)."""
    fmt = sniff(path)
    with progress.shown(os.path.getsize(path), f"load {os.path.basename(path)}"):
        if fmt == "torch":
            from .torch_format import read_torch
            return read_torch(path, map_location, verify, weights_only, expect_crc=expect_crc, mmap=mmap, into=into)
        from .safetensors_format import read_safetensors
        return read_safetensors(path, map_location, verify, weights_only, expect_crc=expect_crc, mmap=mmap)
