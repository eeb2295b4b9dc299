"""The README's Python blocks and the placeholders they run with (tests/project/test_first_hour.py).

The README declares what its blocks leave to the reader: `model`, `opt`, `batch()`, `steps`, `x`,
`t` and `state` (PLACEHOLDERS defines small ones), and `/ssd`, a folder on an SSD (PATHS maps it,
and /dev/shm, into the run's own folder). Nothing else is filled in: a block that needs more than
these fails its test. The blocks of one `## ` section run in order in one process (a later block
may use what an earlier one made, as a reader would type them).
"""
from __future__ import annotations

import re

PLACEHOLDERS = '''
import os
import torch
torch.manual_seed(0)
os.makedirs("ssd", exist_ok=True)
os.makedirs("shm", exist_ok=True)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
steps = 101
def batch():
    return torch.randn(8, 16)
x = batch()
t = torch.randn(1 << 16)
state = {"model": model.state_dict(), "step": 0}
'''
PATHS = {'"/ssd': '"ssd', '"/dev/shm/': '"shm/'}


def sections(readme: str) -> dict[str, str]:
    """`## ` heading -> its Python blocks, in order, joined; sections without one are left out."""
    out: dict[str, str] = {}
    heading = "(top)"
    for part in re.split(r"^(## .*)$", readme, flags=re.M):
        if part.startswith("## "):
            heading = part[3:].strip()
            continue
        blocks = re.findall(r"^```python\n(.*?)^```", part, flags=re.M | re.S)
        if blocks:
            out[heading] = "\n".join(blocks)
    return out


def script(code: str) -> str:
    """A section's code with the placeholders filled in."""
    for declared, here in PATHS.items():
        code = code.replace(declared, here)
    return PLACEHOLDERS + "\n" + code


def lines_not_in(readme_path: str, section: str, marker: str, worker_path: str) -> list[str]:
    """The lines of the first `py` block after `marker` in the README's `## section` that are not
    lines of the worker program a test runs (the README shows what the test runs); raises when
    there is no such block."""
    text = open(readme_path).read().split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    block = text.split(marker, 1)[1].split("```py\n", 1)[1].split("```", 1)[0] if marker else \
        text.split("```py\n", 1)[1].split("```", 1)[0]
    if not block.strip():
        raise AssertionError(f"no py block after {marker!r} in the README's {section!r}")
    worker = {line.strip() for line in open(worker_path)}
    return [line for line in block.splitlines() if line.strip() and line.strip() not in worker]
