"""fastckpt.save / fastckpt.load: one file, synchronous, durable and verified.

save() writes PATH.tmp through the parallel writer, fdatasyncs it, renames it
over PATH and fsyncs the directory, so PATH is either the old file or the new
one, never a torn mix. load() checks every CRC before returning (verify=True).
The saves of a process share one engine (its staging is faulted in and pinned
once); its threads end whenever no save is using it.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable

from .settings import check_seconds
from .write.native_engine import default_engine
from .format import load_file, plan_file
from .fsutil import fsync_dir
from .write import Deadline, FileSink, start_write
from .write.deadline import DEFAULT_STALL_S
from .write.pinning import pin_chunks
from .write.protocol import SnapshotWrite

_pinned = False
_users = 0  # saves using the shared engine now
_users_lock = threading.Lock()


class Saved(int):
    """What save() returns: the bytes written (an int, as it always was), and how they went.

    tools: records written by each tool under save(tool=...) (a named tool that cannot write a
    record leaves it to posix, and says so here); {} for the parallel writer. o_direct: the
    parallel writer's data went through O_DIRECT (False where the filesystem refused it, or
    under tool=...: see tools)."""

    tools: dict
    o_direct: bool

    def __new__(cls, nbytes: int, tools: dict | None = None, o_direct: bool = False) -> "Saved":
        out = super().__new__(cls, nbytes)
        out.tools, out.o_direct = dict(tools or {}), o_direct
        return out


def save(state: Any, path: str | os.PathLike[str], format: str = "torch", strategy: str = "c",
         progress: Callable[[int, int], None] | None = None, tool: Any = None,
         stall_timeout_s: float = DEFAULT_STALL_S, plain: bool = False) -> Saved:
    """Writes state to path durably; returns the number of bytes written (a Saved: also which
    tool wrote how many records, and whether O_DIRECT carried the data).

    plain (format="safetensors"): a file for other tools, as `fastckpt export` writes it:
    exactly the state's tensors under their dotted paths, no pad entries, no shared storages.

    progress(bytes_written, total), if given, is called from this thread while data moves.
    tool: None writes through the parallel writer (strategy); "auto" has Fastensor's adaptive
    choice pick posix / direct / kvikio per storage size from measured write times (the
    file's format is the same); a tool's name, or a fastckpt.offload.TensorIO, decides instead.
    stall_timeout_s: a copy or write of the parallel writer that makes no progress for this long
    fails the save (WriteStalled, naming what it waited for) instead of hanging (the
    Checkpointer's setting); a save with tool= writes on this thread, with no writer to wait for.
    """
    check_seconds("stall_timeout_s", stall_timeout_s)
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"cannot save to {path!r}: directory {parent!r} does not exist")
    if tool is not None:
        return _save_with_tool(state, path, format, tool)
    plan = plan_file(state, format, plain=plain)
    tmp = path + ".tmp"
    engine = _take_engine()
    w = start_write(engine, plan, FileSink(tmp), strategy, Deadline(stall_timeout_s, lambda: engine.progress))
    try:
        w.release_all()
        res = w.finish() if progress is None else _finish_reporting(w, plan.file_size, progress)
    except BaseException as e:
        w.abort(e)
        _give_engine_back(engine, done=False)
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _give_engine_back(engine, done=True)
    os.replace(tmp, path)
    fsync_dir(parent)
    return Saved(res.bytes, o_direct=res.direct_io)


def _take_engine() -> Any:
    """The shared engine of one-file saves, its staging pinned for CUDA copies once."""
    global _pinned, _users
    with _users_lock:
        engine = default_engine()
        if not _pinned:
            _pinned = True
            pin_chunks(engine.pool.addresses(), engine.pool.chunk_bytes)
        _users += 1
        return engine


def _give_engine_back(engine: Any, done: bool) -> None:
    """The last save using the shared engine ends its threads (its staging stays for the next):
    nothing of a finished save keeps running. Not after a failed save, whose writes may still
    be stuck in them (a stalled disk): joining those would hang the error."""
    global _users
    with _users_lock:
        _users -= 1
        if _users == 0 and done:
            engine.park()


def _save_with_tool(state: Any, path: str, format: str, tool: Any) -> Saved:
    from .offload.plan_writer import io_for, say_fallback, write_plan
    io = io_for(tool)  # a bad tool name fails before any file exists
    plan = plan_file(state, format)
    tmp = path + ".tmp"
    try:
        used = write_plan(plan, tmp, io)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))
    say_fallback(io, used, stacklevel=3)  # the caller of save()
    return Saved(plan.file_size, tools=used)


def _finish_reporting(w: SnapshotWrite, total: int, progress: Callable[[int, int], None]) -> Any:
    out: dict = {}

    def run() -> None:
        try:
            out["result"] = w.finish()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            out["error"] = e

    t = threading.Thread(target=run, name="fastckpt-save", daemon=True)
    t.start()
    while t.is_alive():
        progress(w.bytes_written, total)
        t.join(0.2)
    if "error" in out:
        raise out["error"]
    progress(total, total)
    return out["result"]


def load(path: str | os.PathLike[str], map_location: Any = None, verify: bool = True, weights_only: bool = True,
         mmap: bool | None = None) -> Any:
    """Reads a checkpoint file (fastckpt's or torch.save's or a safetensors file).

    By default CPU tensors are views of a private, copy-on-write mapping of the file (as with
    torch.load(mmap=True)); with verify=True every byte has been read and checked on return, and
    a torch-format file mostly not in the page cache is read instead of mapped (O_DIRECT, around
    the cache; mmap=True maps it anyway). mmap=False copies into anonymous memory instead.
    """
    return load_file(os.fspath(path), map_location=map_location, verify=verify,
                     weights_only=weights_only, mmap=mmap)
