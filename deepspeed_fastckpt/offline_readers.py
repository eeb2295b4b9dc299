"""DeepSpeed's offline checkpoint tools, run in the process that is still saving.

`ds_to_universal`, `DeepSpeedCheckpoint` and `zero_to_fp32` read a tag's files with plain
torch.load. Run in-process right after `save_checkpoint` returned (DeepSpeed's own universal
checkpoint tests do so on rank 0), they would read a fastckpt save still in flight: files
missing, or a partial set taken for the whole. Each is wrapped to wait first until every save
of this process into the directory it reads has committed (any open engine's), as a load does.
"""
from __future__ import annotations

import functools
import os

_MARK = "__fastckpt_waits__"


def _waiting(original, save_dir_of):
    if getattr(original, _MARK, False):
        return original

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        from .open_engines import wait_for_saves_into
        wait_for_saves_into(save_dir_of(*args, **kwargs))
        return original(*args, **kwargs)

    setattr(wrapper, _MARK, True)
    return wrapper


def _parent(path) -> str:
    return os.path.dirname(os.path.abspath(os.fspath(path)))


def register() -> None:
    """Wraps what exists in the installed DeepSpeed; a tool it lacks is left alone."""
    try:
        from deepspeed.checkpoint import ds_to_universal
    except ImportError:
        ds_to_universal = None
    try:
        from deepspeed.utils import zero_to_fp32
    except ImportError:
        zero_to_fp32 = None
    targets = [  # (module, attribute, the save_dir its call reads)
        (ds_to_universal, "_get_optim_files", lambda folder, *a, **k: _parent(folder)),
        (zero_to_fp32, "get_fp32_state_dict_from_zero_checkpoint",
         lambda checkpoint_dir, *a, **k: os.fspath(checkpoint_dir)),
    ]
    for module, attr, save_dir_of in targets:
        if module is not None and hasattr(module, attr):
            setattr(module, attr, _waiting(getattr(module, attr), save_dir_of))
    from deepspeed.checkpoint.deepspeed_checkpoint import DeepSpeedCheckpoint
    DeepSpeedCheckpoint.__init__ = _waiting(DeepSpeedCheckpoint.__init__, lambda self, folder, *a, **k: _parent(folder))
