"""Bit-reproducible CPU training across processes: what a process does before its first step.

fastckpt gives back exactly the state a save was given (every load is checked against its
CRCs, and the tests compare what `load()` returns with what `save()` got). Whether a resumed
run then repeats an uninterrupted one bit for bit also depends on the math library under
torch, and one thing there is not reproducible by default: on x86 CPUs, torch computes
`sqrt`, `exp`, `log`, `tanh`, ... (Adam's `exp_avg_sq.sqrt()` among them) through MKL's
vector math (VML), each intra-op thread calling it on its chunk. The first such call of a
process picks MKL's code path for this CPU; when it meets other busy threads (a second
intra-op thread, fastckpt's reader and writer threads, other processes on the machine),
part of that first call was seen (an Intel CPU, MKL 2024.2, torch 2.13) computed by
another, lower-accuracy kernel, 1-6 ulps off in half of one tensor; every later call was
right, and with one warm-up step first no run deviated. A resumed run starts with such a first
step at the resume step, and an uninterrupted run at step 1, so the two can drift apart by
a few ulps that neither checkpoint nor training caused.

`reproducible()` removes that first call from training: it runs every VML function torch
uses, in float32 and float64, first on one thread (the code path chosen with nothing
beside it), then on every intra-op thread (each computes a chunk of its own). It also
fixes the thread count (a reduction split over other thread counts adds in another order)
and turns on `torch.use_deterministic_algorithms`.
"""
from __future__ import annotations

import torch

# The torch ops that reach MKL's vector math on the CPU (ATen/cpu/vml.h binds each of them,
# in float32 and float64): each is called once below
_VECTOR_MATH = ("sqrt", "rsqrt", "exp", "expm1", "log", "log10", "log2", "log1p", "sin", "cos", "tan", "tanh",
                "asin", "acos", "atan", "erf", "erfc", "erfinv", "trunc", "reciprocal")
# The grain of torch's vector-math kernels (UnaryOpsKernel.cpp's IMPLEMENT_FLOAT_KERNEL): a tensor
# of more elements than this is split over the intra-op threads, each calling MKL on its chunk
_GRAIN = 2048


def reproducible(threads: int | None = None, *, seed: int | None = None, deterministic: bool = True) -> int:
    """Makes this process's CPU training repeat bit for bit in another process.

    Call it once at the start of every process whose training is to be compared with
    another's (the uninterrupted run and the resumed one alike), before the model's first
    step and before a Checkpointer starts its threads.

    Args:
        threads: intra-op threads (`torch.set_num_threads`); use the same count in every run.
            None keeps torch's current count.
        seed: `torch.manual_seed(seed)` after the warm-up, when given (the warm-up draws no
            random numbers either way).
        deterministic: `torch.use_deterministic_algorithms(True)`.

    Returns:
        The intra-op thread count the warm-up ran with.
    """
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)
    if deterministic:
        torch.use_deterministic_algorithms(True)
    n = torch.get_num_threads()
    warm_up_vector_math(n)
    if seed is not None:
        torch.manual_seed(seed)
    return n


def warm_up_vector_math(threads: int) -> None:
    """Every vector math function, float32 and float64: once on one thread, then with `threads`
    threads over a tensor that gives each of them a chunk of many grains. Draws no random numbers."""
    try:
        torch.set_num_threads(1)
        _call_each(torch.linspace(0.1, 0.9, 4 * _GRAIN))
    finally:
        torch.set_num_threads(threads)
    _call_each(torch.linspace(0.1, 0.9, 16 * _GRAIN * max(threads, 1)))  # torch splits it over its threads
    a = torch.linspace(-1.0, 1.0, 256 * 256).reshape(256, 256)
    (a @ a).sum()  # BLAS too: its own code path is chosen at its first call


def _call_each(x: torch.Tensor) -> None:
    for dtype in (torch.float32, torch.float64):
        v = x.to(dtype)
        for name in _VECTOR_MATH:
            getattr(torch, name)(v)
