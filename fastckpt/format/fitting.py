"""Whether a checkpoint's structure fits a given one, tensor by tensor: the walk over both.

Owns the one comparison of a state loaded into a given structure (`load(into=...)`): every
difference named (problems), and every tensor paired with its counterpart (pairs). The load
side (fastckpt.restore.into) copies by it, and a file read straight into the given tensors
(`Destination`, torch_format.read_torch) places by it, so both see the same pairs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from ..errors import StateMismatchError


@dataclass(frozen=True)
class Destination:
    """Tensors a load fills: `template` is the structure (or, with `key`, loaded[key]'s)."""

    template: Any
    key: Any = None


def part_of(loaded: Any, key: Any, source: str = "checkpoint") -> Any:
    """loaded[key], or a StateMismatchError naming the parts there are."""
    if not isinstance(loaded, dict) or key not in loaded:
        have = sorted(map(str, loaded)) if isinstance(loaded, dict) else type(loaded).__name__
        raise StateMismatchError(f"{source} has no part {key!r} (it has: {have})")
    return loaded[key]


def walk(template: Any, loaded: Any, path: str, problems: list[str], pairs: list) -> None:
    """Every difference between the two structures appended to problems; every (template
    tensor, loaded tensor) of the same shape and dtype to pairs."""
    if isinstance(template, torch.Tensor):
        if not isinstance(loaded, torch.Tensor):
            problems.append(f"{path}: expected a tensor, checkpoint has {type(loaded).__name__}")
        elif template.shape != loaded.shape or template.dtype != loaded.dtype:
            problems.append(f"{path}: checkpoint has {loaded.dtype}{list(loaded.shape)}, "
                            f"expected {template.dtype}{list(template.shape)}")
        else:
            pairs.append((template, loaded))
    elif isinstance(template, dict):
        if not isinstance(loaded, dict):
            problems.append(f"{path}: expected a dict, checkpoint has {type(loaded).__name__}")
            return
        for k in template.keys() - loaded.keys():
            problems.append(f"{path}.{k}: missing from the checkpoint")
        for k in loaded.keys() - template.keys():
            problems.append(f"{path}.{k}: in the checkpoint but not expected")
        for k in template.keys() & loaded.keys():
            walk(template[k], loaded[k], f"{path}.{k}", problems, pairs)
    elif isinstance(template, (list, tuple)):
        if not isinstance(loaded, (list, tuple)) or len(loaded) != len(template):
            problems.append(f"{path}: expected a sequence of {len(template)}")
            return
        for i, (a, b) in enumerate(zip(template, loaded)):
            walk(a, b, f"{path}[{i}]", problems, pairs)


def owns_its_storage(t: torch.Tensor) -> bool:
    """A plain contiguous CPU tensor that is its whole storage: its bytes can be read in place."""
    return (type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type == "cpu" and t.is_contiguous()
            and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.nbytes > 0
            and not t.is_conj() and not t.is_neg())


def in_place(dest: Destination, structure: Any, key_of: Callable[[torch.Tensor], Optional[str]]
             ) -> Optional[dict[str, torch.Tensor]]:
    """Which stored storages can be read straight into dest's tensors: {storage key: tensor}.
    structure: the file's state on the meta device; key_of(meta tensor) -> its storage key.
    None when the structures differ anywhere (nothing may be written before the load's own
    check names the differences), or when nothing fits. A storage is placed once, into a
    tensor that owns its storage, when the stored tensor is that whole storage and every
    destination tensor in that memory takes its values from that same stored storage (tied as
    the file ties them: else a copy into the memory could run before a copy out of it). Any
    other tensor is copied after the load, as before."""
    try:
        stored = structure if dest.key is None else part_of(structure, dest.key)
    except StateMismatchError:
        return None
    problems: list[str] = []
    pairs: list = []
    walk(dest.template, stored, "state", problems, pairs)
    if problems:
        return None
    sources: dict[int, set] = {}  # destination memory (its storage's address) -> the stored storages copied into it
    for target, meta in pairs:
        if target.device.type == "cpu" and target.nbytes:
            sources.setdefault(target.untyped_storage().data_ptr(), set()).add(key_of(meta))
    placed: dict[str, torch.Tensor] = {}
    for target, meta in pairs:
        key = key_of(meta)
        if key is None or key in placed or not owns_its_storage(target):
            continue
        if sources[target.untyped_storage().data_ptr()] != {key}:
            continue
        if not meta.is_contiguous() or meta.storage_offset() != 0 or meta.untyped_storage().nbytes() != target.nbytes:
            continue
        placed[key] = target
    return placed or None
