"""A rank data file's suffix as fastckpt writes DCP checkpoints, and the step a directory's name says."""
from __future__ import annotations

import re

SUFFIX = ".distcp"  # a rank's data file, as DCP's FileSystemWriter names them
STEP_RE = re.compile(r"(\d+)$")  # step-12, checkpoint_12


def step_of_name(name: str) -> int:
    """The step a checkpoint directory's name ends with (torchtitan's step-12: 12), else -1."""
    found = STEP_RE.search(name)
    return int(found.group(1)) if found else -1
