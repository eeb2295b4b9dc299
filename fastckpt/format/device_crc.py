"""CRC-32 of CUDA memory computed on the GPU, so a GDS write moves no byte to the host for it.

The same function as `_native.crc32` and `zlib.crc32` (the zip polynomial, reflected, init and
final XOR 0xFFFFFFFF), in two phases that split the work over many threads:

  1. segments: the bytes are cut into SEGMENT-byte segments (the last one shorter); one thread
     computes each segment's CRC-32, a byte at a time through the 256-entry table;
  2. combine: a tree over the segment CRCs. A node's CRC is crc(A||B) = (crc(A) * x^(8*len(B))
     mod P) XOR crc(B) — zlib's crc32_combine: the initial and final XORs cancel — with
     x^(8*len) mod P found by squaring (x2nmodp). One launch per level, each thread joins one
     pair; the last node is the CRC of the whole buffer.

`host_crc32` runs the very same two phases with numpy (same table, same segment cut, same
tree, same GF(2) arithmetic): the suite checks it against zlib on CPU, compiles the kernels'
own source for the host (`kernel_source`) and runs it against zlib too, and on a GPU checks the
kernels against both. The kernels are CuPy RawKernels (CuPy is on the GPU
image; `available()` says whether they can run here).
"""
from __future__ import annotations

import functools

import numpy as np

POLY = 0xEDB88320  # the zip polynomial, reflected
SEGMENT = 1024  # bytes per phase-1 thread
THREADS = 256  # per block


def crc_table() -> np.ndarray:
    """The 256-entry byte table of the reflected polynomial."""
    table = np.zeros(256, dtype=np.uint32)
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ POLY if c & 1 else c >> 1
        table[n] = c
    return table


def multmodp(a: int, b: int) -> int:
    """a * b mod P in the reflected bit order (zlib's multmodp)."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                break
        m >>= 1
        b = (b >> 1) ^ POLY if b & 1 else b >> 1
    return p


@functools.lru_cache(maxsize=None)
def _x2n_table() -> tuple[int, ...]:
    """x^(2^k) mod P for k = 0..31 (zlib's x2n_table)."""
    p, out = 1 << 30, []  # x^1
    for _ in range(32):
        out.append(p)
        p = multmodp(p, p)
    return tuple(out)


def x8nmodp(n: int) -> int:
    """x^(8 n) mod P: what crc(A) is multiplied by when n bytes follow A."""
    table, p, k = _x2n_table(), 1 << 31, 3  # x^0; 2^3 = 8 bits a byte
    while n:
        if n & 1:
            p = multmodp(table[k & 31], p)
        n >>= 1
        k += 1
    return p


def _segment_crcs_host(data: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Phase 1 on the host: the CRC of every segment (all segments advance together)."""
    n = data.size
    nseg = -(-n // SEGMENT)
    crc = np.full(nseg, 0xFFFFFFFF, dtype=np.uint32)
    padded = np.zeros(nseg * SEGMENT, dtype=np.uint8)
    padded[:n] = data
    rows = padded.reshape(nseg, SEGMENT)
    last_len = n - (nseg - 1) * SEGMENT
    for i in range(SEGMENT):
        live = slice(None) if i < last_len else slice(0, nseg - 1)  # the last segment ends early
        c = crc[live]
        crc[live] = table[(c ^ rows[live, i]) & 0xFF] ^ (c >> 8)
    return crc ^ np.uint32(0xFFFFFFFF)


def _combine_host(crcs: list[int], n: int) -> int:
    """Phase 2 on the host: the same tree as the kernel, level by level."""
    width = 1  # segments per node at this level
    while len(crcs) > 1:
        nxt = []
        for j in range(0, len(crcs), 2):
            if j + 1 == len(crcs):
                nxt.append(crcs[j])
                continue
            right_begin = (j + 1) * width * SEGMENT
            right_len = min((j + 2) * width * SEGMENT, n) - right_begin
            nxt.append(multmodp(x8nmodp(right_len), crcs[j]) ^ crcs[j + 1])
        crcs, width = nxt, width * 2
    return crcs[0]


def host_crc32(data: bytes | np.ndarray) -> int:
    """CRC-32 of data by the GPU kernels' algorithm, on the host (their reference)."""
    arr = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) else data
    if arr.size == 0:
        return 0
    return _combine_host([int(c) for c in _segment_crcs_host(arr, crc_table())], arr.size)


_SOURCE = r"""
extern "C" {
__device__ unsigned int multmodp(unsigned int a, unsigned int b) {
  unsigned int m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) { p ^= b; if ((a & (m - 1)) == 0) break; }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ POLY : b >> 1;
  }
  return p;
}
__device__ unsigned int x8nmodp(unsigned long long n, const unsigned int* x2n) {
  unsigned int p = 1u << 31;
  int k = 3;
  while (n) {
    if (n & 1) p = multmodp(x2n[k & 31], p);
    n >>= 1;
    k++;
  }
  return p;
}
__global__ void segment_crcs(const unsigned char* data, unsigned long long n, const unsigned int* table_g,
                             unsigned int* out, unsigned long long nseg) {
  __shared__ unsigned int table[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) table[i] = table_g[i];
  __syncthreads();
  unsigned long long s = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= nseg) return;
  unsigned long long begin = s * SEGMENT, end = begin + SEGMENT < n ? begin + SEGMENT : n;
  unsigned int c = 0xFFFFFFFFu;
  for (unsigned long long i = begin; i < end; i++) c = table[(c ^ data[i]) & 0xFF] ^ (c >> 8);
  out[s] = c ^ 0xFFFFFFFFu;
}
__global__ void combine_level(const unsigned int* in, unsigned long long count, unsigned long long width,
                              unsigned long long n, const unsigned int* x2n, unsigned int* out) {
  unsigned long long j = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;  // pair j: nodes 2j, 2j+1
  unsigned long long left = 2 * j;
  if (left >= count) return;
  if (left + 1 == count) { out[j] = in[left]; return; }
  unsigned long long right_begin = (left + 1) * width * SEGMENT;
  unsigned long long right_end = (left + 2) * width * SEGMENT < n ? (left + 2) * width * SEGMENT : n;
  out[j] = multmodp(x8nmodp(right_end - right_begin, x2n), in[left]) ^ in[left + 1];
}
}
"""


def kernel_source() -> str:
    """The CUDA C++ of the two kernels, constants filled in (the suite also compiles it for the
    host with a few macros, one thread per block, to run the kernels' own code against zlib)."""
    return _SOURCE.replace("POLY", f"0x{POLY:08X}u").replace("SEGMENT", f"{SEGMENT}ull")


@functools.lru_cache(maxsize=None)
def _kernels():
    import cupy
    module = cupy.RawModule(code=kernel_source(), options=("-std=c++14",))
    return (module.get_function("segment_crcs"), module.get_function("combine_level"),
            cupy.asarray(crc_table()), cupy.asarray(np.array(_x2n_table(), dtype=np.uint32)))


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether the kernels can run here (CuPy importable, a CUDA device, the module compiles)."""
    try:
        import torch
        if not torch.cuda.is_available():
            return False
        _kernels()
        return True
    except Exception:  # noqa: BLE001 - any failure means "not here": the caller reads the bytes back
        return False


def device_crc32(t, stream=None) -> int:
    """CRC-32 of a contiguous CUDA tensor's bytes, computed on its device (on `stream`, a
    torch.cuda.Stream, else the current one); only the 4-byte result comes to the host."""
    import cupy
    import torch
    b = t.detach().reshape(-1).view(torch.uint8) if t.numel() else t.new_empty(0, dtype=torch.uint8)
    n = b.numel()
    if n == 0:
        return 0
    segment_crcs, combine_level, table, x2n = _kernels()
    stream = stream if stream is not None else torch.cuda.current_stream(b.device)
    with torch.cuda.device(b.device), cupy.cuda.ExternalStream(stream.cuda_stream):
        data = cupy.from_dlpack(b)
        nseg = -(-n // SEGMENT)
        crcs = cupy.empty(nseg, dtype=cupy.uint32)
        segment_crcs(((nseg + THREADS - 1) // THREADS,), (THREADS,),
                     (data, cupy.uint64(n), table, crcs, cupy.uint64(nseg)))
        count, width = nseg, 1
        while count > 1:
            pairs = (count + 1) // 2
            nxt = cupy.empty(pairs, dtype=cupy.uint32)
            combine_level(((pairs + THREADS - 1) // THREADS,), (THREADS,),
                          (crcs, cupy.uint64(count), cupy.uint64(width), cupy.uint64(n), x2n, nxt))
            crcs, count, width = nxt, pairs, width * 2
        return int(crcs[0].get())


def crc32_where_it_is(b, stream=None) -> int:
    """CRC-32 of a flat uint8 tensor where its bytes are: on its GPU when the kernels can run
    there (no byte moves to the host), else on the host (a GPU tensor is copied over first)."""
    from .. import _native
    if not b.numel():
        return 0
    if b.is_cuda and available():
        return device_crc32(b, stream)
    host = b.cpu()
    return _native.crc32(host.data_ptr(), host.numel())
