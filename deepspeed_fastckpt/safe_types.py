"""DeepSpeed types its checkpoints hold besides tensors and plain containers.

fastckpt loads with a restricted unpickler (what torch.load(weights_only=True) accepts);
DeepSpeed's own files also carry a few of its own plain-data types (enums, small records,
loss-scaler state). These are allowed while the engine loads, and while `fastckpt verify`
judges a DeepSpeed folder (deepspeed_fastckpt.folders) — nothing that can run code from the
file: each is an Enum, a namedtuple/dataclass of data, or a class whose unpickling only sets
attributes. A name this DeepSpeed version does not have is left out.
"""
from __future__ import annotations


def deepspeed_safe_globals() -> list:
    out = []
    try:
        from deepspeed.runtime.zero.config import ZeroStageEnum
        out.append(ZeroStageEnum)
    except ImportError:
        pass
    try:
        from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum
        out.append(OffloadDeviceEnum)
    except ImportError:
        pass
    try:
        from deepspeed.utils.tensor_fragment import fragment_address
        out.append(fragment_address)
    except ImportError:
        pass
    try:
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
        out += [LossScaler, DynamicLossScaler]
    except ImportError:
        pass
    return out
