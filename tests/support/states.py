"""Training states for round-trip tests: every dtype, shape and sharing case, bit-exact comparison, and a byte flipped on disk."""
from __future__ import annotations

import os

import torch


ALL_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16,
              torch.int32, torch.int64, torch.uint8, torch.uint16, torch.uint32, torch.uint64,
              torch.bool, torch.complex64, torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2,
              torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]


def random_tensor(shape, dtype, gen) -> torch.Tensor:
    raw = torch.randint(0, 256, (int(torch.tensor(shape).prod().item()) * torch.empty((), dtype=dtype).element_size(),),
                        dtype=torch.uint8, generator=gen)
    if dtype == torch.bool:
        return (raw % 2).bool().reshape(shape)
    return raw.view(dtype).reshape(shape)


def state_matrix(device: str = "cpu") -> dict:
    """Every dtype, empty, 0-d, non-contiguous, views sharing storage, nested containers."""
    g = torch.Generator().manual_seed(1234)
    s = {f"dt_{str(dt).split('.')[-1]}": random_tensor((3, 5), dt, g) for dt in ALL_DTYPES}
    base = torch.randn(64, 32, generator=g)
    s.update({
        "empty": torch.empty(0, 4), "scalar": torch.tensor(2.5, dtype=torch.float64),
        "scalar_int": torch.tensor(7), "big": torch.randn(300_000, generator=g),
        "base": base, "transposed": base.t(), "slice": base[3:9, ::3], "row": base[5],
        "param": torch.nn.Parameter(torch.randn(4, 4, generator=g)),
        "frozen": torch.nn.Parameter(torch.randn(2, generator=g), requires_grad=False),
        "optim": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(8, generator=g)},
                            1: {"step": torch.tensor(3.0), "exp_avg": torch.randn(8, generator=g)}},
                  "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0, 1],
                                    "eps": 1e-8, "amsgrad": False, "foreach": None}]},
        "meta": {"epoch": 3, "name": "run", "size": torch.Size([2, 3]), "inf": float("inf"),
                 "list": [1, 2.5, None, True, "x"], "tuple": (1, (2, 3)), "bytes": b"\x00\x01"},
    })
    if device != "cpu":
        s = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in s.items()}
    return s


def assert_same(a, b, path="root", strides: bool = True):
    """Bit-exact equality of nested states (dtype, shape, stride, bytes, type, requires_grad);
    strides=False: the values alone, however laid out (an export for other tools stores each
    tensor as the contiguous tensor it reads as)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert type(a) is type(b), f"{path}: {type(a)} vs {type(b)}"
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
        assert a.requires_grad == b.requires_grad, path
        assert not strides or a.stride() == b.stride(), f"{path}: stride {a.stride()} vs {b.stride()}"
        # bytes compared on the host: a loader may put a tensor on another device than it was saved from
        ua = a.detach().cpu().contiguous().view(-1).view(torch.uint8) if a.numel() else a.detach().cpu()
        ub = b.detach().cpu().contiguous().view(-1).view(torch.uint8) if b.numel() else b.detach().cpu()
        assert torch.equal(ua, ub), f"{path}: bytes differ"
        return
    assert type(a) is type(b), f"{path}: {type(a)} vs {type(b)}"
    if isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}", strides)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]", strides)
    elif isinstance(a, float) and a != a:
        assert b != b, path
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


def equal(a, b) -> bool:
    """Bit-exact equality of nested states whose dicts may list their keys in another order (a
    state DCP loaded: its optimizer's param_groups come back reordered): tensors by dtype, shape,
    strides and values; lists, tuples and the rest by value."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and a.stride() == b.stride() and torch.equal(a, b))
    return a == b


def assert_sharing(state):
    """The views of `base` still share its storage after a load."""
    ptr = state["base"].untyped_storage().data_ptr()
    for k in ("transposed", "slice", "row"):
        assert state[k].untyped_storage().data_ptr() == ptr, f"{k} lost its sharing"


def flip_byte(path, at: float = 0.6) -> None:
    """One bit of the file at `at` of its length flipped in place: damage a CRC must catch."""
    with open(path, "r+b") as f:
        f.seek(int(os.path.getsize(path) * at))
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x40]))
