"""The campaign's training states: each derived from its step, so any loaded one can be
checked bit for bit; several dtypes, a shared view and nested optimizer state."""
from __future__ import annotations

import torch


def state_for(step: int, mib: float = 1.5) -> dict:
    g = torch.Generator().manual_seed(step)
    rows = max(1, int(mib * (1 << 20) / 4 / 6 / 1024))
    base = torch.randn(rows, 1024, generator=g)
    return {"model": {f"w{i}": torch.randn(rows, 1024, generator=g) for i in range(4)},
            "half": torch.randn(rows, 512, generator=g).to(torch.bfloat16),
            "view": base[:, :256], "base": base,
            "optim": {"state": {0: {"step": torch.tensor(float(step)),
                                    "counts": torch.randint(0, 1 << 40, (64,), generator=g)}},
                      "param_groups": [{"lr": 1e-3, "params": [0]}]},
            "step": step}


def same(a, b) -> bool:
    """Bit-exact equality of nested states (types, dtypes, shapes, bytes)."""
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)))
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b
