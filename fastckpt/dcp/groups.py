"""The process group an async DCP save's own collectives may talk on: `save_group()`.

`dcp.async_save` runs DCP's collectives (the plan, the gather of every rank's results, the
commit) on a thread of its own, on the `process_group` it is given, the default group when none.
A FastStager's and a FastStorageWriter's own agreements never use the default group: each makes
gloo groups of its own when it is constructed. What stays on the caller's group is DCP's own
collectives. When training runs collectives on the default group while a save is in flight (DDP's
all-reduces, FSDP2's all-gathers), the two would interleave there and gloo aborts or a rank waits
forever, as with any stager: pass `process_group=save_group()` then, as torchtitan passes a group
of its own. A job whose saves finish before its next collective (or with one rank) needs none.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Optional

import torch.distributed as dist

from ..commit.agreement import spread

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

_made: dict[int, ProcessGroup] = {}
_lock = threading.Lock()


def save_group() -> Optional[ProcessGroup]:
    """A gloo group for checkpoint saves, made once per default group (call it on every rank, in
    the same order as other groups, like any new_group); None with one rank."""
    if not spread():
        return None
    key = id(dist.distributed_c10d._get_default_group())
    with _lock:
        if key not in _made:
            _made[key] = dist.new_group(backend="gloo")
        return _made[key]
