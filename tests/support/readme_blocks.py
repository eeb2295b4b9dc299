"""The Python blocks of the README and of docs/*.md and the placeholders they run with
(tests/project/test_first_hour.py).

The README (and each docs/ page with blocks) declares what its blocks leave to the reader:
`model`, `opt`, `batch()`, `steps`, `x`, `t` and `state` (PLACEHOLDERS defines small ones; a
Lightning block's `module` and `data`: LIGHTNING_PLACEHOLDERS), and
`/ssd`, a folder on an SSD (PATHS maps it, and /dev/shm, into the run's own folder). Nothing else
is filled in: a block that needs more than these fails its test. The blocks of one `## ` section
of one file run in order in one process (a later block may use what an earlier one made, as a
reader would type them).
"""
from __future__ import annotations

import ast
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
# a Lightning block's `module` and `data` (a page with Lightning blocks declares them): a small
# LightningModule and its DataLoader, defined only for a block that imports Lightning
LIGHTNING_PLACEHOLDERS = '''
import lightning as _L
class _Module(_L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(16, 1)
    def training_step(self, b, i):
        return torch.nn.functional.mse_loss(self.net(b[0]), b[1])
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
module = _Module()
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randn(64, 1)),
                                   batch_size=8)
'''


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
    lightning = LIGHTNING_PLACEHOLDERS if "import lightning" in code and re.search(r"\b(module|data)\b", code) else ""
    return PLACEHOLDERS + lightning + "\n" + code


def section_block(doc_path: str, section: str, marker: str = "") -> str:
    """The first ```python block after `marker` in the `## section` of a page."""
    parts = re.split(rf"^## {re.escape(section)}[ \t]*$", open(doc_path).read(), maxsplit=1, flags=re.M)
    if len(parts) < 2:
        raise AssertionError(f"no section '## {section}' in {doc_path}")
    text = parts[1].split("\n## ", 1)[0]
    if marker and marker not in text:
        raise AssertionError(f"no {marker!r} in {doc_path}'s {section!r}")
    after = text.split(marker, 1)[1] if marker else text
    found = re.search(r"^```python\n(.*?)^```", after, flags=re.M | re.S)
    if not found:
        raise AssertionError(f"no python block after {marker!r} in {doc_path}'s {section!r}")
    return found.group(1)


def _calls(source: str, names: tuple[str, ...]) -> list[tuple[str, int, tuple[str, ...]]]:
    """(the function's name, how many positional arguments, its keyword names) of each call of
    one of names (a plain name or an attribute: `trainer.fit` is `fit`)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in names:
                out.append((name, len(node.args), tuple(sorted(k.arg or "**" for k in node.keywords))))
    return out


def calls_not_in(doc_path: str, section: str, marker: str, worker_path: str, names: tuple[str, ...]) -> list[str]:
    """The page's block runs as written (test_first_hour runs every python block); the program a
    test runs on several ranks with real signals makes the same calls: each call in the block of
    one of `names` (the API the page is about), with the same number of positional arguments and
    the same keyword names, is a call the worker makes too (its values are the test's own).
    Returns the block's calls the worker does not make; raises when the block makes none."""
    doc = _calls(section_block(doc_path, section, marker), names)
    if not doc:
        raise AssertionError(f"{doc_path}'s {section!r} block calls none of {names}")
    worker = set(_calls(open(worker_path).read(), names))
    return [f"{n}({a} positional, keywords {k})" for n, a, k in doc if (n, a, k) not in worker]
