"""A restricted unpickler: what torch.load(weights_only=True) accepts, nothing more.

Owns the loading half of the pickle. Globals resolve only against an allowlist
(containers, torch.Size/dtype/device, storage types, torch's tensor rebuild
functions, and what the user allowlisted with torch.serialization.add_safe_globals);
anything else is refused with the name of the global, before it can run.
"""
from __future__ import annotations

import codecs
import collections
import io
import pickle
from typing import Any, Callable

import torch

from ..errors import UnsafeCheckpointError

_REBUILDERS = {
    "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter",
    "_rebuild_parameter_with_state", "_rebuild_sparse_tensor", "_rebuild_nested_tensor",
    "_rebuild_meta_tensor_no_storage", "_rebuild_qtensor", "_rebuild_device_tensor_from_numpy",
}


def _latin1_encode(obj: str, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    """How protocol 2 pickles bytes; only text codecs, never zlib/bz2/base64 tricks."""
    if encoding.replace("-", "").lower() not in {"latin1", "utf8", "ascii"}:
        raise UnsafeCheckpointError(f"refusing codec {encoding!r} inside a checkpoint pickle")
    return codecs.encode(obj, encoding, errors)


def _allowed_global(module: str, name: str) -> Any:
    if module == "collections" and name == "OrderedDict":
        return collections.OrderedDict
    if module in ("builtins", "__builtin__") and name in {"set", "frozenset", "bytearray", "slice", "complex"}:
        return {"set": set, "frozenset": frozenset, "bytearray": bytearray, "slice": slice,
                "complex": complex}[name]
    if module == "_codecs" and name == "encode":
        return _latin1_encode
    if module == "torch._utils" and name in _REBUILDERS:
        return getattr(torch._utils, name)
    if module == "torch._tensor" and name == "_rebuild_from_type_v2":
        return _rebuild_from_type_v2
    if module == "torch" and name == "Size":
        return torch.Size
    if module == "torch" and name == "device":
        return torch.device
    if module == "torch.nn.parameter" and name == "Parameter":
        return torch.nn.Parameter
    if module in ("torch", "torch.storage") and name == "UntypedStorage":
        return torch.UntypedStorage
    if module == "torch" and name == "Tensor":
        return torch.Tensor
    if module == "torch":
        obj = getattr(torch, name, None)
        if isinstance(obj, torch.dtype):
            return obj
        if isinstance(obj, type) and (issubclass(obj, torch.storage._LegacyStorage)
                                      or obj is torch.UntypedStorage):
            return obj
    for allowed in torch.serialization.get_safe_globals():
        obj = allowed[0] if isinstance(allowed, tuple) else allowed
        path = allowed[1] if isinstance(allowed, tuple) else f"{obj.__module__}.{obj.__qualname__}"
        if path == f"{module}.{name}":
            return obj
    return None


def _rebuild_from_type_v2(func, new_type, args, state):
    """torch's rebuild for Tensor/Parameter (func was itself resolved through the allowlist)."""
    if new_type not in (torch.Tensor, torch.nn.Parameter):
        raise UnsafeCheckpointError(f"refusing tensor subclass {new_type!r} in a checkpoint")
    return torch._tensor._rebuild_from_type_v2(func, new_type, args, state)


class SafeUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, persistent_load: Callable[[tuple], Any], source: str):
        super().__init__(io.BytesIO(data), encoding="utf-8")
        self._persistent = persistent_load
        self._source = source

    def find_class(self, module: str, name: str) -> Any:
        obj = _allowed_global(module, name)
        if obj is None:
            raise UnsafeCheckpointError(
                f"{self._source}: refusing to load global '{module}.{name}' — it is not on the "
                "allowlist (what torch.load(weights_only=True) accepts). If you trust this file, "
                "allow it with torch.serialization.add_safe_globals([...]) or pass weights_only=False.")
        return obj

    def persistent_load(self, pid):
        return self._persistent(pid)


def unpickle(data: bytes, persistent_load: Callable[[tuple], Any], source: str,
             weights_only: bool = True) -> Any:
    if weights_only:
        return SafeUnpickler(data, persistent_load, source).load()

    class _Trusting(pickle.Unpickler):
        def persistent_load(self, pid):
            return persistent_load(pid)

    return _Trusting(io.BytesIO(data), encoding="utf-8").load()
