"""fastckpt.save / fastckpt.load: one file, synchronous, durable and verified.

save() writes PATH.tmp through the parallel writer, fdatasyncs it, renames it
over PATH and fsyncs the directory, so PATH is either the old file or the new
one, never a torn mix. load() checks every CRC before returning (verify=True).
"""
from __future__ import annotations

import os

from .engine import default_engine
from .format import load_file, plan_file
from .fsutil import fsync_dir
from .snapshot import start_write


def save(state, path: str | os.PathLike, format: str = "torch", strategy: str = "c") -> int:
    """Writes state to path durably; returns the number of bytes written."""
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"cannot save to {path!r}: directory {parent!r} does not exist")
    plan = plan_file(state, format)
    tmp = path + ".tmp"
    w = start_write(default_engine(), plan, tmp, strategy, direct_io=True)
    try:
        res = w.finish()
    except BaseException:
        w.abort("save failed")
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    os.replace(tmp, path)
    fsync_dir(parent)
    return res.bytes


def load(path: str | os.PathLike, map_location=None, verify: bool = True, weights_only: bool = True,
         mmap: bool | None = None):
    """Reads a checkpoint file (fastckpt's or torch.save's or a safetensors file).

    By default CPU tensors are views of a private, copy-on-write mapping of the file (as with
    torch.load(mmap=True)); with verify=True every byte has been read and checked on return.
    mmap=False copies into anonymous memory instead.
    """
    return load_file(os.fspath(path), map_location=map_location, verify=verify,
                     weights_only=weights_only, mmap=mmap)
