"""Loading into a given structure: check every tensor's shape and dtype, then copy in place.

A tensor the load already read straight into its destination (format.fitting.in_place) is the
destination's own memory: it is not copied again.
"""
from __future__ import annotations

import torch

from ..errors import StateMismatchError
from ..format.fitting import part_of, walk


def copy_into(template, loaded, source: str = "checkpoint", key=None):
    """Copies loaded tensors (or loaded[key]) into template's tensors; raises StateMismatchError
    listing every difference."""
    if key is not None:
        loaded, source = part_of(loaded, key, source), f"{source}[{key!r}]"
    problems: list[str] = []
    pairs: list = []
    walk(template, loaded, "state", problems, pairs)
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
            if (dst.data_ptr() == src.data_ptr() and dst.stride() == src.stride()
                    and dst.is_conj() == src.is_conj() and dst.is_neg() == src.is_neg()):
                continue  # read in place: these are the destination's bytes already
            dst.copy_(src)
    return template
