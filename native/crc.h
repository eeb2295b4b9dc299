// crc.h — CRC-32 (the zip polynomial) over raw memory, and the combine step
// that joins CRCs of adjacent ranges computed in parallel. Backed by zlib,
// whose crc32_z runs at several GB/s per core.
#pragma once
#include <zlib.h>

#include <cstddef>
#include <cstdint>

namespace fastckpt {

inline uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  return static_cast<uint32_t>(::crc32_z(crc, static_cast<const Bytef*>(data), n));
}

// CRC of A||B from crc(A), crc(B) and len(B).
inline uint32_t crc32_concat(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  if (len_b == 0) return crc_a;
  return static_cast<uint32_t>(::crc32_combine(crc_a, crc_b, static_cast<z_off_t>(len_b)));
}

}  // namespace fastckpt
