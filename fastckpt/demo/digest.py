"""The demo's proof of what fastckpt owns: a digest of each state a save is given, recorded by
the training process before the save is issued, and compared after the kill with a digest of
what load() returned.

The digest covers a training state as the demo builds it: tensors (dtype, shape, every byte),
dicts (entries in key order: a state equal up to the order of its keys is the same state),
lists and tuples, and plain values (str, int, float, bool, None: their type and repr, which is
exact for each). Anything else is refused rather than digested loosely.
"""
from __future__ import annotations

import hashlib
import json
import os

import torch

_PLAIN = (str, int, float, bool, type(None))


def state_digest(obj) -> str:
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()[:16]


def _feed(h, obj) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"tensor {t.dtype} {tuple(t.shape)};".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().data if t.numel() else b"")  # no copy of the bytes
    elif isinstance(obj, dict):
        h.update(f"dict {len(obj)};".encode())
        for k in sorted(obj, key=lambda k: (type(k).__name__, repr(k))):
            _feed(h, k)
            _feed(h, obj[k])
    elif isinstance(obj, (list, tuple)):
        h.update(f"{type(obj).__name__} {len(obj)};".encode())
        for v in obj:
            _feed(h, v)
    elif isinstance(obj, _PLAIN):
        h.update(f"{type(obj).__name__} {obj!r};".encode())
    else:
        raise TypeError(f"the demo's state digest takes tensors, dicts, lists, tuples and plain values, "
                        f"not {type(obj).__name__}")


def record_saved(path: str, step: int, state) -> None:
    """Appends {step, digest} of the state a save is about to be given to `path`. Before the save
    is issued, so a checkpoint that commits always has its digest written; one write() of a short
    line, so a kill -9 leaves whole lines (a torn last one is skipped by saved_digests)."""
    line = json.dumps({"step": step, "digest": state_digest(state)}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def saved_digests(path: str) -> dict[int, str]:
    """step -> digest of the state saved at that step, as record_saved wrote them."""
    out: dict[int, str] = {}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
                out[int(r["step"])] = str(r["digest"])
            except (ValueError, KeyError, TypeError):
                continue  # a line torn by the kill
    return out
