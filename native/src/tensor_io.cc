// tensor_io.cc — the definitions of tensor_io.h (the bounce buffer is an IoMemory).
#include "fastckpt/tensor_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "fastckpt/file_io.h"
#include "fastckpt/io_memory.h"

namespace fastckpt {

void write_buffered(const std::string& path, uint64_t off, const void* src, uint64_t n, bool sync) {
  UniqueFd fd(open_or_throw(path, O_WRONLY | O_CREAT));
  pwrite_full(fd.get(), src, n, off, path);
  if (sync) fdatasync_or_throw(fd.get(), path);
}

void read_buffered(const std::string& path, uint64_t off, void* dst, uint64_t n) {
  UniqueFd fd(open_or_throw(path, O_RDONLY));
  pread_full(fd.get(), dst, n, off, path);
}

namespace detail {
// The bounce buffer for the `left` bytes still to move: at most kDirectBounce, no more than they
// need (an IoMemory is faulted in whole when made: a small tensor must not pay for 8 MiB).
IoMemory bounce_for(uint64_t left) { return IoMemory(std::min(kDirectBounce, round_up(left, kAlign))); }
int open_o_direct(const std::string& path, int flags) {
#ifdef O_DIRECT
  int fd = ::open(path.c_str(), flags | O_DIRECT | O_CLOEXEC, 0644);
  if (fd < 0) throw_io("open (O_DIRECT)", path, 0, errno);
  return fd;
#else
  throw IoError("O_DIRECT is not available on this platform: " + path, EINVAL);
#endif
}
}  // namespace detail

void write_direct(const std::string& path, uint64_t off, const void* src, uint64_t n, bool sync) {
  if (off % kAlign) throw std::invalid_argument("direct writes start 4096-aligned");
  UniqueFd fd(detail::open_o_direct(path, O_WRONLY | O_CREAT));
  uint64_t done = 0;
  if (reinterpret_cast<uintptr_t>(src) % kAlign == 0) {
    // a page-aligned source (a file's mapping): its whole blocks go to the disk as they lie, no copy
    const uint64_t whole = n / kAlign * kAlign;
    while (done < whole) {
      uint64_t len = std::min(8 * kDirectBounce, whole - done);
      if (!pwrite_full(fd.get(), static_cast<const uint8_t*>(src) + done, len, off + done, path, true))
        throw IoError("O_DIRECT write refused (EINVAL) by the filesystem of " + path, EINVAL);
      done += len;
    }
  }
  if (done < n) {
    IoMemory buf = detail::bounce_for(n - done);
    while (done < n) {
      uint64_t len = std::min(kDirectBounce, n - done);
      std::memcpy(buf.data(), static_cast<const uint8_t*>(src) + done, len);
      uint64_t whole = round_up(len, kAlign);
      if (whole > len) std::memset(buf.data() + len, 0, whole - len);
      if (!pwrite_full(fd.get(), buf.data(), whole, off + done, path, true))
        throw IoError("O_DIRECT write refused (EINVAL) by the filesystem of " + path, EINVAL);
      done += len;
    }
  }
  if (::ftruncate(fd.get(), static_cast<off_t>(off + n)) != 0) throw_io("ftruncate", path, off + n, errno);
  if (sync) fdatasync_or_throw(fd.get(), path);
}

void read_direct(const std::string& path, uint64_t off, void* dst, uint64_t n) {
  if (off % kAlign) throw std::invalid_argument("direct reads start 4096-aligned");
  UniqueFd fd(detail::open_o_direct(path, O_RDONLY));
  IoMemory buf = detail::bounce_for(n);
  for (uint64_t done = 0; done < n;) {
    uint64_t len = std::min(kDirectBounce, n - done);
    uint64_t whole = round_up(len, kAlign);
    ssize_t r;
    do {
      r = ::pread(fd.get(), buf.data(), whole, static_cast<off_t>(off + done));
    } while (r < 0 && errno == EINTR);
    if (r < 0) throw_io("read (O_DIRECT)", path, off + done, errno);
    if (static_cast<uint64_t>(r) < len)
      throw IoError("read failed on '" + path + "': file is shorter than its header says (truncated?)", EIO);
    std::memcpy(static_cast<uint8_t*>(dst) + done, buf.data(), len);
    done += len;
  }
}

}  // namespace fastckpt
