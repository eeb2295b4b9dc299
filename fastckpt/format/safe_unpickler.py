"""A restricted unpickler: what torch.load(weights_only=True) accepts, nothing more.

Owns the loading half of the pickle. Before anything is built, scan() walks the opcodes
(no objects made): globals must be on the allowlist, memo indices and nesting are bounded,
and lengths must fit the data, so a crafted pickle can neither run code nor make the C
unpickler allocate without bound. Globals resolve only against an allowlist (containers,
torch.Size/dtype/device, storage types, torch's tensor rebuild functions — views checked to
fit their storage — and what the user allowlisted with torch.serialization.add_safe_globals);
anything else is refused with the name of the global, before it can run. Any other failure
while unpickling is a CorruptCheckpointError.
"""
from __future__ import annotations

import codecs
import collections
import io
import pickle
import pickletools
from typing import Any, Callable

import torch

from ..errors import CorruptCheckpointError, FastckptError, UnsafeCheckpointError
from .views import check_view

MAX_DEPTH = 10_000  # stack or mark depth: pickle batches containers by 1000, so only nesting gets here

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
    if module == "torch._utils" and name in _CHECKED:
        return _CHECKED[name]
    if module == "torch._utils" and name in _REBUILDERS:
        return getattr(torch._utils, name)
    if module == "torch._tensor" and name == "_rebuild_from_type_v2":
        return _rebuild_from_type_v2
    if module == "torch" and name == "Size":
        return torch.Size
    if module == "torch" and name == "device":
        return torch.device
    if module == "torch.serialization" and name == "_get_layout":  # how torch pickles a torch.layout
        return torch.serialization._get_layout
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


def _checked(rebuild: Callable) -> Callable:
    """torch's rebuild of a view of a storage, once the view is known to fit it."""
    def checked(storage, storage_offset, size, stride, *rest):
        if not isinstance(storage, torch.storage.TypedStorage):
            raise CorruptCheckpointError("data.pkl rebuilds a tensor from something that is not a storage")
        check_view(storage._untyped_storage.nbytes(), storage.element_size(), storage_offset, size, stride,
                   "data.pkl")
        return rebuild(storage, storage_offset, size, stride, *rest)
    checked.__name__ = rebuild.__name__
    return checked


_CHECKED = {n: _checked(getattr(torch._utils, n)) for n in ("_rebuild_tensor_v2", "_rebuild_tensor_v3",
                                                           "_rebuild_qtensor")}


def _rebuild_from_type_v2(func, new_type, args, state):
    """torch's rebuild for Tensor/Parameter (func was itself resolved through the allowlist)."""
    if new_type not in (torch.Tensor, torch.nn.Parameter):
        raise UnsafeCheckpointError(f"refusing tensor subclass {new_type!r} in a checkpoint")
    return torch._tensor._rebuild_from_type_v2(func, new_type, args, state)


def _refusal(source: str, module: str, name: str) -> str:
    return (f"{source}: refusing to load global '{module}.{name}' — it is not on the allowlist (what "
            "torch.load(weights_only=True) accepts). If you trust this file, allow it with "
            "torch.serialization.add_safe_globals([...]) or pass weights_only=False.")


class SafeUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, persistent_load: Callable[[tuple], Any], source: str):
        super().__init__(io.BytesIO(data), encoding="utf-8")
        self._persistent = persistent_load
        self._source = source

    def find_class(self, module: str, name: str) -> Any:
        obj = _allowed_global(module, name)
        if obj is None:
            raise UnsafeCheckpointError(_refusal(self._source, module, name))
        return obj

    def persistent_load(self, pid):
        return self._persistent(pid)


_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}
_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}
_GETS = {"GET", "BINGET", "LONG_BINGET"}


_PASSED: "collections.OrderedDict[tuple, None]" = collections.OrderedDict()  # small pickles that passed scan
PASSED_MAX_BYTES, PASSED_MAX = 64 << 10, 4096


def scan(data: bytes, source: str) -> None:
    """Checks a pickle's opcodes without building anything: every global is allowlisted,
    memo indices stay below the number of opcodes, stack and marks stay under MAX_DEPTH,
    and every length fits the data. Raises UnsafeCheckpointError / CorruptCheckpointError.

    The same small pickle, met again under the same allowlist, is not walked again: a DCP
    checkpoint holds one archive per tensor item, and items of the same shape and dtype pickle
    to the very same bytes (walking each took most of a verified load's time)."""
    key = None
    if len(data) <= PASSED_MAX_BYTES:
        key = (bytes(data), tuple(map(id, torch.serialization.get_safe_globals())))
        if key in _PASSED:
            return
    _walk(data, source)
    if key is not None:
        _PASSED[key] = None
        while len(_PASSED) > PASSED_MAX:
            _PASSED.popitem(last=False)


def _walk(data: bytes, source: str) -> None:
    """scan()'s walk over every opcode."""
    depth, marks, strings, ops = 0, [], [], 0
    memo: dict[int, object] = {}  # memo index -> the string stored there (None: anything else)
    last, last_was_string = None, False
    try:
        for op, arg, pos in pickletools.genops(data):
            ops += 1
            name = op.name
            if name in ("GLOBAL", "STACK_GLOBAL"):
                if name == "STACK_GLOBAL" and len(strings) < 2:
                    raise CorruptCheckpointError(f"{source}: STACK_GLOBAL without its two names (byte {pos})")
                module, attr = arg.split(" ", 1) if name == "GLOBAL" else strings
                if _allowed_global(module, attr) is None:
                    raise UnsafeCheckpointError(_refusal(source, module, attr))
            if name in _STRINGS:
                strings = (strings + [arg])[-2:]
            elif name in _GETS and isinstance(memo.get(arg), str):  # a name memoized earlier (protocol 4+)
                strings = (strings + [memo[arg]])[-2:]
            elif name not in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT", "FRAME", "PROTO"):
                strings = []
            if name == "MEMOIZE" or name in _PUTS:
                key = len(memo) if name == "MEMOIZE" else int(arg)
                memo[key] = last if last_was_string else None
            last, last_was_string = arg, name in _STRINGS
            if name in _PUTS and int(arg) > ops:
                raise CorruptCheckpointError(f"{source}: pickle memo index {arg} at byte {pos} is out of range")
            if name == "MARK":
                marks.append(depth)
                depth = 0
            elif pickletools.markobject in op.stack_before:
                if not marks:
                    raise CorruptCheckpointError(f"{source}: pickle pops a mark it never pushed (byte {pos})")
                depth = marks.pop() - op.stack_before.index(pickletools.markobject)
            else:
                depth -= len(op.stack_before)
            depth += len(op.stack_after)
            if depth > MAX_DEPTH or len(marks) > MAX_DEPTH:
                raise CorruptCheckpointError(f"{source}: pickle nests deeper than {MAX_DEPTH} levels")
    except ValueError as e:  # genops: truncated data, a length past the end, an unknown opcode
        raise CorruptCheckpointError(f"{source}: damaged pickle ({e})") from None


def unpickle(data: bytes, persistent_load: Callable[[tuple], Any], source: str,
             weights_only: bool = True) -> Any:
    if weights_only:
        scan(data, source)
        try:
            return SafeUnpickler(data, persistent_load, source).load()
        except FastckptError:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError,
                RuntimeError, OverflowError, RecursionError, MemoryError) as e:
            raise CorruptCheckpointError(f"{source}: cannot rebuild the pickled state ({type(e).__name__}: {e})") from None

    class _Trusting(pickle.Unpickler):
        def persistent_load(self, pid):
            return persistent_load(pid)

    return _Trusting(io.BytesIO(data), encoding="utf-8").load()
