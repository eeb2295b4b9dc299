"""The pointer file: what a pool-backed save leaves at the path a framework looks in.

A framework that globs its own folders for files (DeepSpeed's tags) finds, where a file would
be, a small JSON naming the pool and the model the data went to. `fastckpt verify` follows it
(fastckpt.pmem.commands.verify_pointer); `fastckpt export POOL OUT --model MODEL` writes the file.
"""
from __future__ import annotations

import json

from ..fsutil import read_regular, write_atomic

KEY = "fastckpt_pool"


def write_pointer(path: str, pool: str, model: str) -> None:
    write_atomic(path, json.dumps({KEY: pool, "model": model,
                                   "note": "the data is in the pool; `fastckpt export POOL OUT "
                                           "--model MODEL --to torch` writes the file"}).encode())


def is_pool_pointer(path: str) -> bool:
    """Whether path is a pointer file (any readable file that is not one is not)."""
    try:
        body = json.loads(read_regular(path, 4096))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(body, dict) and KEY in body
