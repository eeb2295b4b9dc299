"""DeepSpeed types its checkpoints hold besides tensors and plain containers.

Kept in the core beside tag_records (DeepSpeed's folder layout) because two users need it:
the DeepSpeed engine when it loads, and `fastckpt verify` judging a DeepSpeed folder the same
way. Names are resolved with importlib only when DeepSpeed is installed; nothing is imported
from it otherwise.

fastckpt loads with a restricted unpickler (what torch.load(weights_only=True) accepts);
DeepSpeed's own files also carry a few of its own plain-data types (enums, small records,
loss-scaler state). These are allowed while the DeepSpeed engine loads — nothing that can
run code from the file: each is an Enum, a namedtuple/dataclass of data, or a class whose
unpickling only sets attributes.
"""
from __future__ import annotations

import importlib

_NAMES = (
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    ("deepspeed.runtime.zero.offload_config", "OffloadDeviceEnum"),
    ("deepspeed.utils.tensor_fragment", "fragment_address"),
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
    ("deepspeed.checkpoint.constants", "PARAM_SLICE_MAPPINGS"),
)


def deepspeed_safe_globals() -> list:
    out = []
    for module, name in _NAMES:
        try:
            obj = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        if isinstance(obj, type):
            out.append(obj)
    return out
