// crc.h — CRC-32 (the zip polynomial) over raw memory, and the combine step
// that joins CRCs of adjacent ranges computed in parallel.
//
// The CRC is the largest CPU cost of a checkpoint after the copy, and on a
// busy training host every CPU cycle it takes comes out of the step. So the
// sum itself comes from libdeflate (carry-less multiply, ~14 GB/s per core on
// the 2-core CI VM) when its shared library is on the machine, found with
// dlopen so that neither building nor running needs it; otherwise from zlib's
// crc32_z (~6 GB/s there). Both compute the same function. Combining uses zlib.
#pragma once
#include <dlfcn.h>
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace fastckpt {

using Crc32Fn = uint32_t (*)(uint32_t, const void*, size_t);

namespace detail {

inline uint32_t zlib_crc32(uint32_t crc, const void* data, size_t n) {
  return static_cast<uint32_t>(::crc32_z(crc, static_cast<const Bytef*>(data), n));
}

struct CrcBackend {
  Crc32Fn fn = zlib_crc32;
  std::string name = std::string("zlib ") + zlibVersion();

  CrcBackend() {
    if (const char* force = std::getenv("FASTCKPT_CRC"); force && std::string(force) == "zlib") return;
    void* lib = dlopen("libdeflate.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    auto sym = reinterpret_cast<Crc32Fn>(dlsym(lib, "libdeflate_crc32"));
    // Trust it only once it agrees with zlib on a known vector.
    static const char probe[] = "fastckpt crc probe 0123456789";
    if (sym && sym(0, probe, sizeof probe - 1) == zlib_crc32(0, probe, sizeof probe - 1)) {
      fn = sym;
      name = "libdeflate";
    }
  }
};

inline const CrcBackend& crc_backend() {
  static const CrcBackend backend;
  return backend;
}

}  // namespace detail

inline uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  return detail::crc_backend().fn(crc, data, n);
}

inline const std::string& crc32_backend_name() { return detail::crc_backend().name; }

// CRC of A||B from crc(A), crc(B) and len(B).
inline uint32_t crc32_concat(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  if (len_b == 0) return crc_a;
  return static_cast<uint32_t>(::crc32_combine(crc_a, crc_b, static_cast<z_off_t>(len_b)));
}

}  // namespace fastckpt
