"""Loading into a given structure: check every tensor's shape and dtype, then copy in place."""
from __future__ import annotations

import torch

from .errors import StateMismatchError


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


def copy_into(template, loaded, source: str = "checkpoint"):
    """Copies loaded tensors into template's tensors; raises StateMismatchError listing every difference."""
    problems: list[str] = []
    pairs: list = []
    _walk(template, loaded, "state", problems, pairs)
    if problems:
        shown = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
        raise StateMismatchError(
            f"{source} does not match the structure it is loaded into ({shown}). Is it from a "
            "different model? Load it into the model it was saved from, or load without into= "
            "and convert it yourself.")
    with torch.no_grad():
        for dst, src in pairs:
            dst.copy_(src)
    return template
