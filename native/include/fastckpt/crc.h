// crc.h — CRC-32 (the zip polynomial) over raw memory, and the combine step
// that joins CRCs of adjacent ranges computed in parallel.
//
// The CRC is the largest CPU cost of a checkpoint after the copy, and on a
// busy training host every CPU cycle it takes comes out of the step. So the
// sum itself comes from libdeflate (carry-less multiply, ~14 GB/s per core on
// the 2-core CI VM) when its shared library is on the machine, found with
// dlopen so that neither building nor running needs it; otherwise from zlib's
// crc32_z (~6 GB/s there). Both compute the same function. Combining uses zlib.
// Definitions (and the one backend, chosen on first use): src/crc.cc.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace fastckpt {

using Crc32Fn = uint32_t (*)(uint32_t, const void*, size_t);

// Continues crc over n bytes at data, with the backend chosen on first use.
uint32_t crc32_update(uint32_t crc, const void* data, size_t n);

// Which backend computes the sums: "libdeflate" or "zlib <version>".
const std::string& crc32_backend_name();

// CRC of A||B from crc(A), crc(B) and len(B).
uint32_t crc32_concat(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

}  // namespace fastckpt
