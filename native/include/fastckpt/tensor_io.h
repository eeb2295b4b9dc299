// tensor_io.h — one tensor's bytes to or from one file region, two ways (Fastensor's
// "tools" that live in the native core):
//   buffered: pwrite/pread through the page cache;
//   direct:   O_DIRECT through an aligned bounce buffer (whole 4 KiB blocks; the file is
//             cut back to off + n afterwards). EINVAL from the kernel (tmpfs and others)
//             comes back as an IoError with that errno, so the caller can say "not here".
// Definitions: src/tensor_io.cc.
#pragma once
#include <cstdint>
#include <string>

namespace fastckpt {

// The bounce buffer of the direct path: the most one O_DIRECT call moves.
constexpr uint64_t kDirectBounce = 8ull << 20;

void write_buffered(const std::string& path, uint64_t off, const void* src, uint64_t n, bool sync);

void read_buffered(const std::string& path, uint64_t off, void* dst, uint64_t n);

// off must be 4096-aligned. Writes whole blocks, then truncates the file to off + n.
void write_direct(const std::string& path, uint64_t off, const void* src, uint64_t n, bool sync);

// off must be 4096-aligned. Reads whole blocks through the bounce buffer; a file shorter than
// off + n is an IoError.
void read_direct(const std::string& path, uint64_t off, void* dst, uint64_t n);

}  // namespace fastckpt
