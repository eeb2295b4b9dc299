"""The CRC-32 a GPU computes for GDS writes (fastckpt/format/device_crc.py): on CPU its algorithm
(segments, then a tree of combines) runs as the host reference and must equal zlib.crc32 at
every segment boundary; on a GPU the CuPy kernels must equal both, and a kvikio write must take
its CRCs there instead of moving bytes to the host."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

from fastckpt import _native
from fastckpt.format import device_crc
from fastckpt.format.device_crc import SEGMENT, host_crc32, multmodp, x8nmodp

LENGTHS = [0, 1, 7, SEGMENT - 1, SEGMENT, SEGMENT + 1, 2 * SEGMENT, 3 * SEGMENT + 5, 4 * SEGMENT,
           5 * SEGMENT - 1, 9 * SEGMENT + 333, 100_003]


@pytest.mark.parametrize("n", LENGTHS)
def test_the_host_reference_is_zlibs_crc32(n):
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    assert host_crc32(data) == zlib.crc32(data.tobytes())


def test_the_combine_step_is_the_native_concat():
    rng = np.random.default_rng(1)
    for n_a, n_b in [(1, 1), (10, SEGMENT), (SEGMENT, 3 * SEGMENT + 1), (5, 1 << 20)]:
        a, b = (rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (n_a, n_b))
        joined = multmodp(x8nmodp(len(b)), zlib.crc32(a)) ^ zlib.crc32(b)
        assert joined == zlib.crc32(a + b) == _native.crc32_concat(zlib.crc32(a), zlib.crc32(b), len(b))


def test_a_changed_byte_changes_the_crc_in_every_segment():
    data = np.zeros(4 * SEGMENT + 17, dtype=np.uint8)
    base = host_crc32(data)
    for at in (0, SEGMENT - 1, SEGMENT, 2 * SEGMENT + 5, data.size - 1):
        flipped = data.copy()
        flipped[at] ^= 0x40
        assert host_crc32(flipped) != base and host_crc32(flipped) == zlib.crc32(flipped.tobytes())


needs_kernels = pytest.mark.skipif(not device_crc.available(), reason="needs a CUDA device and CuPy")


@pytest.mark.gpu
@needs_kernels
@pytest.mark.parametrize("n", LENGTHS + [(64 << 20) + 3])
def test_the_gpu_kernels_equal_zlib_and_the_host_reference(n):
    t = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
    host = t.cpu().numpy()
    got = device_crc.device_crc32(t)
    assert got == zlib.crc32(host.tobytes())
    if n < 1 << 20:
        assert got == host_crc32(host)


@pytest.mark.gpu
@needs_kernels
def test_the_gpu_kernels_read_any_dtype_and_an_unaligned_start():
    x = torch.randn(3, 1 << 16, device="cuda", dtype=torch.bfloat16)
    assert device_crc.device_crc32(x) == zlib.crc32(x.cpu().view(torch.uint8).numpy().tobytes())
    raw = torch.randint(0, 256, (SEGMENT * 5,), dtype=torch.uint8, device="cuda")[3:]  # odd address
    assert device_crc.device_crc32(raw) == zlib.crc32(raw.cpu().numpy().tobytes())


HARNESS = r"""
#include <cstdio>
#include <vector>
struct Dim { unsigned long long x; };
static Dim blockIdx, threadIdx, blockDim;
#define __global__
#define __device__
#define __shared__ static
#define __syncthreads()
KERNELS
static std::vector<unsigned char> slurp(const char* path) {
  std::vector<unsigned char> v;
  FILE* f = std::fopen(path, "rb");
  int c;
  while ((c = std::fgetc(f)) != EOF) v.push_back((unsigned char)c);
  std::fclose(f);
  return v;
}
int main(int, char** argv) {
  std::vector<unsigned char> data = slurp(argv[1]), tb = slurp(argv[2]), xb = slurp(argv[3]);
  const unsigned int* table = (const unsigned int*)tb.data();
  const unsigned int* x2n = (const unsigned int*)xb.data();
  unsigned long long n = data.size(), seg = SEGMENT_BYTES, nseg = (n + seg - 1) / seg;
  std::vector<unsigned int> crcs(nseg);
  blockDim.x = 1;  // one thread a block: the table copy before __syncthreads is then whole
  threadIdx.x = 0;
  for (blockIdx.x = 0; blockIdx.x < nseg; blockIdx.x++) segment_crcs(data.data(), n, table, crcs.data(), nseg);
  unsigned long long count = nseg, width = 1;
  while (count > 1) {
    unsigned long long pairs = (count + 1) / 2;
    std::vector<unsigned int> next(pairs);
    for (blockIdx.x = 0; blockIdx.x < pairs; blockIdx.x++) combine_level(crcs.data(), count, width, n, x2n, next.data());
    crcs.swap(next);
    count = pairs;
    width *= 2;
  }
  std::printf("%u\n", nseg ? crcs[0] : 0u);
}
"""


def test_the_kernels_own_source_computes_zlibs_crc32_on_the_host(tmp_path):
    """The CUDA C++ itself, compiled for the host (a few macros, one thread a block) and run over
    every segment and tree level as the launches would: a mistake in the kernels shows here,
    without spending device time."""
    import shutil
    import subprocess
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    src = HARNESS.replace("KERNELS", device_crc.kernel_source()).replace("SEGMENT_BYTES", str(SEGMENT))
    (tmp_path / "harness.cc").write_text(src)
    subprocess.run([compiler, "-O1", "-std=c++14", "-o", str(tmp_path / "harness"), str(tmp_path / "harness.cc")],
                   check=True, capture_output=True)
    (tmp_path / "table.bin").write_bytes(device_crc.crc_table().tobytes())
    (tmp_path / "x2n.bin").write_bytes(np.array(device_crc._x2n_table(), dtype=np.uint32).tobytes())
    for n in LENGTHS:
        data = np.random.default_rng(n + 7).integers(0, 256, n, dtype=np.uint8).tobytes()
        (tmp_path / "data.bin").write_bytes(data)
        out = subprocess.run([str(tmp_path / "harness"), *(str(tmp_path / f) for f in ("data.bin", "table.bin",
                              "x2n.bin"))], check=True, capture_output=True, text=True).stdout
        assert int(out) == zlib.crc32(data), n
