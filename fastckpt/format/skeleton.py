"""The non-tensor part of a state as JSON (for the safetensors format).

Owns a lossless, code-free encoding of what model/optimizer/Lightning state
dicts hold: dicts with any keys (optimizer state uses int keys), OrderedDict,
lists, tuples, torch.Size, dtypes, devices, non-finite floats, bytes, sets,
complex numbers, and tensors as references to entries. Anything else is an
error, unless the caller opts into pickling it: such a value is then loaded by the
restricted unpickler (what torch.load(weights_only=True) accepts, plus the user's
torch.serialization safe globals), or by plain pickle only with weights_only=False.
"""
from __future__ import annotations

import base64
import collections
import math
import pickle
from typing import Any, Callable

import torch

from ..errors import ConfigError, UnsafeCheckpointError
from .safe_unpickler import unpickle


def encode(obj: Any, on_tensor: Callable[[torch.Tensor, str], dict], allow_pickle: bool = False,
           path: str = "") -> Any:
    """JSON-ready form of obj; on_tensor(t, path) returns the tensor's reference record."""
    def enc(o, p):
        if o is None or isinstance(o, (bool, str)):
            return o
        if isinstance(o, int):
            return o
        if isinstance(o, float):
            return o if math.isfinite(o) else {"$f": repr(o)}
        if isinstance(o, torch.Tensor):
            return {"$tensor": on_tensor(o, p)}
        if isinstance(o, torch.Size):
            return {"$size": list(o)}
        if isinstance(o, collections.OrderedDict):
            return {"$od": [[enc(k, p), enc(v, _join(p, k))] for k, v in o.items()]}
        if type(o) is dict:
            return {"$d": [[enc(k, p), enc(v, _join(p, k))] for k, v in o.items()]}
        if type(o) is list:
            return [enc(v, _join(p, i)) for i, v in enumerate(o)]
        if type(o) is tuple:
            return {"$t": [enc(v, _join(p, i)) for i, v in enumerate(o)]}
        if isinstance(o, torch.dtype):
            return {"$dtype": str(o).removeprefix("torch.")}
        if isinstance(o, torch.device):
            return {"$device": str(o)}
        if isinstance(o, (bytes, bytearray)):
            return {"$b": base64.b64encode(bytes(o)).decode()}
        if isinstance(o, (set, frozenset)):
            return {"$set" if isinstance(o, set) else "$fset": [enc(v, p) for v in o]}
        if isinstance(o, complex):
            return {"$c": [enc(o.real, p), enc(o.imag, p)]}
        if allow_pickle:
            return {"$pickle": base64.b64encode(pickle.dumps(o)).decode()}
        raise ConfigError(
            f"value at {p or '<root>'!r} of type {type(o).__name__} cannot be stored in the "
            "safetensors format's JSON skeleton; convert it to plain types, use format='torch', "
            "or pass allow_pickle=True (loading it will then need weights_only=False)")
    return enc(obj, path)


def decode(data: Any, on_tensor: Callable[[dict], torch.Tensor], weights_only: bool = True) -> Any:
    def dec(d):
        if isinstance(d, list):
            return [dec(v) for v in d]
        if not isinstance(d, dict):
            return d
        if len(d) != 1:
            raise ValueError("malformed skeleton node")
        (tag, v), = d.items()
        if tag == "$tensor":
            return on_tensor(v)
        if tag == "$d":
            return {_key(dec(k)): dec(x) for k, x in v}
        if tag == "$od":
            return collections.OrderedDict((_key(dec(k)), dec(x)) for k, x in v)
        if tag == "$t":
            return tuple(dec(x) for x in v)
        if tag == "$size":
            return torch.Size(v)
        if tag == "$f":
            return float(v)
        if tag == "$dtype":
            dt = getattr(torch, v, None)
            if not isinstance(dt, torch.dtype):
                raise ValueError(f"unknown dtype {v!r}")
            return dt
        if tag == "$device":
            return torch.device(v)
        if tag == "$b":
            return base64.b64decode(v)
        if tag == "$set":
            return {dec(x) for x in v}
        if tag == "$fset":
            return frozenset(dec(x) for x in v)
        if tag == "$c":
            return complex(dec(v[0]), dec(v[1]))
        if tag == "$pickle":
            return unpickle(base64.b64decode(v), _no_storages, "a pickled value in the skeleton", weights_only)
        raise ValueError(f"unknown skeleton tag {tag!r}")
    return dec(data)


def _no_storages(pid):
    raise UnsafeCheckpointError("a pickled value in the skeleton refers to a storage; tensors are entries")


def _key(k):
    return tuple(k) if isinstance(k, list) else k


def _join(prefix: str, key) -> str:
    return f"{prefix}.{key}" if prefix else str(key)
