"""A small transformer block, and a watch on what activation offload hands back to autograd.

`BlockNet` maps a (batch, 32) input through a Linear to `tokens` tokens of width `width`, one
pre-norm transformer block (LayerNorm, attention whose heads are split with view + transpose,
so backward saves transposed and permuted activations, a GELU MLP), then to 8 outputs: the
saved tensors of real models, in a model the 2-core tests can train.

`kinds_of_tensors(device)` is every kind of saved tensor a layout can differ in (transposed,
permuted, channels_last, slices with gaps, expanded, ...); `SavesForBackward` saves one of them
for backward as an op saves an activation; `same_tensor` compares shape, strides, dtype,
device and values.

`LayoutWatch(offload)` wraps an ActivationOffload's pack and unpack hooks: every saved tensor's
shape, strides, dtype and device are noted at pack, and what unpack hands back is compared
with them. `checked` counts the tensors that went through a file; `mismatches` names each
one that came back otherwise.
"""
from __future__ import annotations

import math

import torch


class Block(torch.nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.GELU(),
                                       torch.nn.Linear(2 * width, width))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        att = scores.softmax(dim=-1) @ v
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class BlockNet(torch.nn.Module):
    def __init__(self, width: int = 64, tokens: int = 16, heads: int = 4):
        super().__init__()
        self.tokens, self.width = tokens, width
        self.embed = torch.nn.Linear(32, tokens * width)
        self.block = Block(width, heads)
        self.head = torch.nn.Linear(width, 8)

    def forward(self, x):
        h = self.embed(x).view(x.shape[0], self.tokens, self.width)
        return self.head(self.block(h).mean(dim=1))


def _geometry(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.dtype, t.device


class LayoutWatch:
    def __init__(self, offload):
        self.checked, self.mismatches = 0, []
        pack, unpack = offload._pack, offload._unpack

        def watched_pack(t):
            return _geometry(t), pack(t)

        def watched_unpack(packed):
            before, inner = packed
            back = unpack(inner)
            if back is not inner:  # it went through a file
                self.checked += 1
                if _geometry(back) != before:
                    self.mismatches.append(f"packed {before}, unpacked {_geometry(back)}")
            return back

        offload._pack, offload._unpack = watched_pack, watched_unpack

    def summary(self) -> dict:
        return {"checked": self.checked, "mismatches": list(self.mismatches)}


def kinds_of_tensors(device: str = "cpu") -> dict:
    """Every kind of saved tensor, some over 1 MiB (a tool must not treat large ones differently)."""
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(device)

    big = r(768, 512)  # 1.5 MiB
    return {
        "contiguous": r(64, 96),
        "contiguous-big": big,
        "transposed": r(64, 96).t(),
        "transposed-big": big.t(),
        "permuted": r(4, 5, 6, 7).permute(2, 0, 3, 1),
        "attention-heads": r(2, 16, 4, 8).transpose(1, 2),  # (b, t, h, d) -> (b, h, t, d)
        "channels_last": r(2, 3, 8, 8).to(memory_format=torch.channels_last),
        "slice-with-gaps": r(64, 96)[:, ::3],
        "slice-of-columns": r(64, 96)[3:40, 10:20],
        "slice-with-gaps-big": big[:, 1::2],
        "expanded": r(1, 96).expand(64, 96),
        "odd-strides-of-size-1-dims": r(1, 5).as_strided((1, 5, 1), (7, 1, 3)),
        "scalar": r(1)[0],
        "empty": torch.empty(0, 3, device=device),
        "bfloat16-transposed": r(32, 48).to(torch.bfloat16).t(),
        "int8-permuted": (r(3, 4, 5) * 20).to(torch.int8).permute(1, 2, 0),
        "bool-slice": (r(64, 96) > 0)[:, 1::2],
    }


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype and a.device == b.device
            and torch.equal(a, b))


class SavesForBackward(torch.autograd.Function):
    """Saves `saved` for backward (as an op saves an activation) and hands what backward got
    back to `out`."""

    @staticmethod
    def forward(ctx, x, saved, out):
        ctx.save_for_backward(saved)
        ctx.out = out
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.out.append(ctx.saved_tensors[0])
        return grad, None, None
