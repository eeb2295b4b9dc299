"""The Python blocks of the README and of docs/*.md and the placeholders they run with
(tests/project/test_first_hour.py).

The README (and each docs/ page with blocks) declares what its blocks leave to the reader:
`model`, `opt`, `batch()`, `steps`, `x`, `t` and `state` (PLACEHOLDERS defines small ones), and
`/ssd`, a folder on an SSD (PATHS maps it, and /dev/shm, into the run's own folder). Nothing else
is filled in: a block that needs more than these fails its test. The blocks of one `## ` section
of one file run in order in one process (a later block may use what an earlier one made, as a
reader would type them).
"""
from __future__ import annotations

import glob
import os
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


def documents(root: str) -> list[str]:
    """The files whose Python blocks run, relative to the repository's root: README.md, then every
    page of docs/."""
    pages = sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "*.md")))
    return ["README.md", *pages]


def all_sections(root: str) -> dict[str, str]:
    """`FILE: heading` -> that section's Python blocks, for every file of documents()."""
    out: dict[str, str] = {}
    for name in documents(root):
        with open(os.path.join(root, name)) as f:
            for heading, code in sections(f.read()).items():
                out[f"{name}: {heading}"] = code
    return out


def script(code: str) -> str:
    """A section's code with the placeholders filled in."""
    for declared, here in PATHS.items():
        code = code.replace(declared, here)
    return PLACEHOLDERS + "\n" + code


def lines_not_in(doc_path: str, section: str, marker: str, worker_path: str) -> list[str]:
    """The lines of the first `py` block after `marker` in the `## section` of a page (the README
    or a docs/ page) that are not lines of the worker program a test runs (the page shows what the
    test runs); raises when there is no such section or block."""
    parts = re.split(rf"^## {re.escape(section)}[ \t]*$", open(doc_path).read(), maxsplit=1, flags=re.M)
    if len(parts) < 2:
        raise AssertionError(f"no section '## {section}' in {doc_path}")
    text = parts[1].split("\n## ", 1)[0]
    if marker and marker not in text:
        raise AssertionError(f"no {marker!r} in {doc_path}'s {section!r}")
    after = text.split(marker, 1)[1] if marker else text
    block = after.split("```py\n", 1)[1].split("```", 1)[0] if "```py\n" in after else ""
    if not block.strip():
        raise AssertionError(f"no py block after {marker!r} in {doc_path}'s {section!r}")
    worker = {line.strip() for line in open(worker_path)}
    return [line for line in block.splitlines() if line.strip() and line.strip() not in worker]
