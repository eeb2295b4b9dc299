"""fastckpt.reproducible(): the thread count, deterministic kernels and the math library warmed
up before a process's first step; it draws no random numbers; two processes that call it and
then train the same first steps (where a process's first vector-math call was seen to deviate)
end bit-identical while other processes keep the cores busy."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import fastckpt
from support.paths import ROOT


@pytest.fixture
def torch_settings():
    """Whatever a test changes of torch's process-wide settings is put back."""
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(det)


def test_it_sets_threads_and_kernels_and_draws_no_random_numbers(torch_settings):
    torch.use_deterministic_algorithms(False)
    torch.manual_seed(7)
    want = torch.rand(4)
    torch.manual_seed(7)
    assert fastckpt.reproducible(threads=1) == 1
    assert torch.get_num_threads() == 1 and torch.are_deterministic_algorithms_enabled()
    assert torch.equal(torch.rand(4), want)  # the warm-up took nothing from the generator


def test_seed_and_keeping_the_thread_count(torch_settings):
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(False)
    assert fastckpt.reproducible(seed=3, deterministic=False) == 1
    assert not torch.are_deterministic_algorithms_enabled()
    got = torch.rand(4)
    torch.manual_seed(3)
    assert torch.equal(got, torch.rand(4))


def test_a_bad_thread_count_is_a_clear_error(torch_settings):
    with pytest.raises(ValueError, match="threads must be at least 1, got 0"):
        fastckpt.reproducible(threads=0)


FIRST_STEPS = """
import hashlib, torch, fastckpt
fastckpt.reproducible(threads=2, seed=0)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.LayerNorm(1024),
                            torch.nn.Linear(1024, 256))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
for _ in range(3):
    x = torch.randn(64, 256, generator=g)
    (model(x).tanh() - x).pow(2).mean().backward()
    opt.step(); opt.zero_grad()
h = hashlib.sha256()
for t in list(model.state_dict().values()) + [s for st in opt.state.values() for s in st.values()]:
    h.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
print(h.hexdigest())
"""


def test_two_processes_train_their_first_steps_bit_identically():
    """Adam's sqrt, GELU's erf, tanh: each process's first calls. Three processes of two threads
    each run at once on this machine's cores (2 here), so each trains beside busy ones: the
    load a busy loop beside them gave, without a loop's core spent on nothing."""
    procs = [subprocess.Popen([sys.executable, "-c", FIRST_STEPS], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT) for _ in range(3)]
    try:
        got = [(p.communicate(timeout=300), p.returncode) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    for (out, err), code in got:
        assert code == 0, err[-3000:]
    assert len({out for (out, _), _ in got}) == 1, [out for (out, _), _ in got]
