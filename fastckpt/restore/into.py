"""Loading into a given structure: check every tensor's shape and dtype, then copy in place."""
from __future__ import annotations

import torch

from ..errors import StateMismatchError


def _walk(template, loaded, path: str, problems: list[str], pairs: list) -> None:
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
            _walk(template[k], loaded[k], f"{path}.{k}", problems, pairs)
    elif isinstance(template, (list, tuple)):
        if not isinstance(loaded, (list, tuple)) or len(loaded) != len(template):
            problems.append(f"{path}: expected a sequence of {len(template)}")
            return
        for i, (a, b) in enumerate(zip(template, loaded)):
            _walk(a, b, f"{path}[{i}]", problems, pairs)


def part_of(loaded, key, source: str = "checkpoint"):
    """loaded[key], or a StateMismatchError naming the parts there are."""
    if not isinstance(loaded, dict) or key not in loaded:
        have = sorted(map(str, loaded)) if isinstance(loaded, dict) else type(loaded).__name__
        raise StateMismatchError(f"{source} has no part {key!r} (it has: {have})")
    return loaded[key]


def copy_into(template, loaded, source: str = "checkpoint", key=None):
    """Copies loaded tensors (or loaded[key]) into template's tensors; raises StateMismatchError
    listing every difference."""
    if key is not None:
        loaded, source = part_of(loaded, key, source), f"{source}[{key!r}]"
    problems: list[str] = []
    pairs: list = []
    _walk(template, loaded, "state", problems, pairs)
    if problems:
        shown = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
        if isinstance(loaded, dict) and isinstance(template, dict) and not template.keys() & loaded.keys():
            parts = sorted(k for k, v in loaded.items() if isinstance(v, dict))
            hint = f" — load one part of it with key=, e.g. key={parts[0]!r}" if parts else ""
            raise StateMismatchError(f"{source} has none of the keys it is loaded into: it holds "
                                     f"{sorted(map(str, loaded))}{hint}")
        raise StateMismatchError(
            f"{source} does not match the structure it is loaded into ({shown}). Is it from a "
            "different model? Load it into the model it was saved from, or load without into= "
            "and convert it yourself.")
    with torch.no_grad():
        for dst, src in pairs:
            dst.copy_(src)
    return template
