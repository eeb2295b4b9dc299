"""Progress of long reads and writes, shown the way the ecosystem shows it: a tqdm bar on a
terminal, nothing when the output is no terminal (tqdm's `disable=None`), and nothing for
work too small to need one.

`shown(total, desc)` is a context in which the readers (fastckpt.format.reading) report the
bytes they have read and checked to one bar; `report(n)` is how they do. A context opened
while another is open reports to the outer one (an export's read and write are one bar each,
a load inside it adds no second one).
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import sys
from typing import Optional

# work under this many bytes ends before a bar would say anything (FASTCKPT_PROGRESS_MB: another bound)
WORTH_A_BAR = int(float(os.environ.get("FASTCKPT_PROGRESS_MB", "1024")) * (1 << 20))

_current: contextvars.ContextVar = contextvars.ContextVar("fastckpt_progress", default=None)


@contextlib.contextmanager
def shown(total: int, desc: str, at_least: Optional[int] = None):
    """A bar of total bytes for the block, when stderr is a terminal and total >= at_least."""
    if _current.get() is not None or total < (WORTH_A_BAR if at_least is None else at_least) or not _on_terminal():
        yield _current.get()
        return
    from tqdm import tqdm
    bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, leave=False, file=sys.stderr)
    token = _current.set(bar)
    try:
        yield bar
    finally:
        _current.reset(token)
        bar.close()


def report(nbytes: int) -> None:
    """nbytes more were read (or written): the open bar, if any, moves."""
    bar = _current.get()
    if bar is not None and nbytes:
        bar.update(nbytes)


def bar() -> Optional[object]:
    return _current.get()


def _on_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
