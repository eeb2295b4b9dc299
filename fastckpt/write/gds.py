"""kvikio (GPU Direct Storage, or kvikio's compat mode) as an option of the file sink.

Owns finding out whether kvikio is usable here (`kvikio_mode`) and the file half of a
GDS write: opening the file through kvikio, one parallel pwrite per record straight from
device (or host) memory, polling the futures, then the headers, ftruncate and fdatasync.
The CRCs of GDS-written records are taken on the device (format/device_crc.py, CuPy) while
kvikio writes them, or read back from the file where CuPy cannot run (the data never passed
the host).
"""
from __future__ import annotations

import os

import torch

def kvikio_mode() -> str | None:
    """'gds', 'compat' or None (kvikio missing or no usable driver)."""
    try:
        import kvikio
        import kvikio.defaults
    except Exception:  # noqa: BLE001 - any import failure means "not here"
        return None
    try:
        compat = kvikio.defaults.get("compat_mode") if hasattr(kvikio.defaults, "get") else kvikio.defaults.compat_mode()
    except Exception:  # noqa: BLE001
        return None
    return "compat" if str(compat).lower() not in ("false", "compatmode.off", "0") else "gds"


class GdsFile:
    """A file being written by kvikio; pwrite() returns a future with done() and get()."""

    def __init__(self, path: str):
        import kvikio
        self.path = path
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))  # an OSError that names the path
        self._file = kvikio.CuFile(path, "w")
        self.mode = f"kvikio-{kvikio_mode()}"

    def pwrite(self, buf: torch.Tensor, file_off: int):
        src = buf if buf.is_cuda else buf.numpy()
        return self._file.pwrite(src, buf.numel(), file_off)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def finish_file(path: str, blobs: list[tuple[int, bytes]], file_size: int) -> None:
    """Headers at their offsets, the file cut to its size, everything fdatasync'ed."""
    fd = os.open(path, os.O_WRONLY)
    try:
        for off, data in blobs:
            os.pwrite(fd, data, off)
        os.ftruncate(fd, file_size)
        os.fdatasync(fd)
    finally:
        os.close(fd)
