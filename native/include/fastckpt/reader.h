// reader.h — parallel positional reads of file ranges into caller memory,
// with the CRC-32 of every range computed while the bytes are still hot; a large part that is
// not in the page cache is read with O_DIRECT into a bounce buffer and copied out (reader.cc).
// Definitions: src/reader.cc.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fastckpt {

struct ReadRange {
  uintptr_t dst;
  uint64_t file_off;
  uint64_t len;
};

// Reads every range; returns one CRC per range. Large ranges are split into
// split_bytes pieces so all threads work on a single big tensor too. A file that ends before a
// range does is an IoError.
std::vector<uint32_t> read_ranges(const std::string& path, const std::vector<ReadRange>& ranges,
                                  size_t threads, uint64_t split_bytes, bool with_crc);

// Whether at least half of a file's bytes are in the page cache (false for an empty file, true
// where it cannot be told): a verified load maps such a file, and reads one that is not.
bool file_mostly_cached(const std::string& path);

// CRC-32 of each (address, length) range of memory (e.g. a mapped file), in
// parallel: large ranges are split so every thread has work.
std::vector<uint32_t> crc_ranges(const std::vector<std::pair<uintptr_t, uint64_t>>& ranges,
                                 size_t threads, uint64_t split_bytes);

// Copies n bytes with `threads` threads (a second host copy of a tensor), large pieces streamed
// past the cache (stream_copy.h).
void copy_parallel(void* dst, const void* src, size_t n, size_t threads);

}  // namespace fastckpt
