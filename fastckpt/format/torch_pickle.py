"""data.pkl exactly as torch.save pickles it, with the storages collected aside.

Owns the saving half of the pickle: a protocol-2 pickler whose persistent ids
are torch's ('storage', <StorageType>, key, location, numel) tuples, so views
keep sharing one storage record and torch.load reads the result unchanged.
"""
from __future__ import annotations

import collections
import io
import pickle
from dataclasses import dataclass

import torch
from torch.serialization import location_tag, normalize_storage_type


# types whose objects are never storages: persistent_id answers them without isinstance checks
# (TypedStorage's metaclass makes those slow), which the pickler runs for every object it meets
_NEVER_STORAGES = frozenset({int, float, complex, str, bytes, bool, type(None), tuple, list, dict, set,
                             collections.OrderedDict, torch.Size, torch.dtype, torch.device, torch.Tensor,
                             torch.nn.Parameter})


@dataclass
class StorageRef:
    key: str
    storage: torch.UntypedStorage
    nbytes: int
    location: str


def pickle_state(obj) -> tuple[bytes, list[StorageRef]]:
    """Returns (data.pkl bytes, storages in key order)."""
    storages: dict[str, StorageRef] = {}
    keys: dict[int, str] = {}
    dtypes: dict[int, torch.dtype] = {}

    def persistent_id(o):
        if type(o) in _NEVER_STORAGES:  # the pickler asks of every object: most are these
            return None
        if not (isinstance(o, torch.storage.TypedStorage) or torch.is_storage(o)):
            return None
        if isinstance(o, torch.storage.TypedStorage):
            storage = o._untyped_storage
            dtype = o.dtype
            storage_type = getattr(torch, o._pickle_storage_type())
            numel = o._size()
        else:
            storage = o
            dtype = torch.uint8
            storage_type = normalize_storage_type(type(o))
            numel = storage.nbytes()
        if storage.device.type == "meta":
            raise ValueError("cannot checkpoint tensors on the meta device (they hold no data)")
        if storage.data_ptr() != 0:
            seen = dtypes.setdefault(storage.data_ptr(), dtype)
            if seen != dtype:
                raise ValueError("cannot save tensors that view the same data as different dtypes")
        key = keys.setdefault(storage._cdata, str(len(keys)))
        location = location_tag(storage)
        storages[key] = StorageRef(key, storage, storage.nbytes(), location)
        return ("storage", storage_type, key, location, numel)

    class _Pickler(pickle.Pickler):
        def persistent_id(self, o):  # noqa: D401 - pickle hook
            return persistent_id(o)

    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump(obj)
    return buf.getvalue(), list(storages.values())
