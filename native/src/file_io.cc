// file_io.cc — the definitions of file_io.h: the syscall loops and their error messages.
#include "fastckpt/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace fastckpt {

std::string errno_text(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

void throw_io(const char* op, const std::string& path, uint64_t off, int err) {
  throw IoError(std::string(op) + " failed on '" + path + "' at offset " + std::to_string(off) +
                    ": " + errno_text(err),
                err);
}

bool pwrite_full(int fd, const void* buf, size_t n, uint64_t off, const std::string& path,
                 bool einval_ok) {
  const char* p = static_cast<const char*>(buf);
  size_t done = 0;
  while (done < n) {
    ssize_t w = ::pwrite(fd, p + done, n - done, static_cast<off_t>(off + done));
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL && einval_ok && done == 0) return false;
      throw_io("write", path, off + done, errno);
    }
    if (w == 0) throw_io("write", path, off + done, EIO);
    done += static_cast<size_t>(w);
  }
  return true;
}

void pread_full(int fd, void* buf, size_t n, uint64_t off, const std::string& path) {
  char* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd, p + done, n - done, static_cast<off_t>(off + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw_io("read", path, off + done, errno);
    }
    if (r == 0)
      throw IoError("read failed on '" + path + "' at offset " + std::to_string(off + done) +
                        ": file is shorter than its index says (truncated?)",
                    EIO);
    done += static_cast<size_t>(r);
  }
}

int open_or_throw(const std::string& path, int flags, mode_t mode) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  if (fd < 0) throw_io("open", path, 0, errno);
  return fd;
}

int open_cut_to(const std::string& path, int flags, uint64_t size) {
  int fd = open_or_throw(path, flags | O_CREAT);
  struct stat st {};
  const char* failed = ::fstat(fd, &st) != 0 ? "fstat"
      : static_cast<uint64_t>(st.st_size) > size && ::ftruncate(fd, static_cast<off_t>(size)) != 0 ? "ftruncate"
      : nullptr;
  if (failed != nullptr) {
    const int err = errno;
    ::close(fd);
    throw_io(failed, path, size, err);
  }
  return fd;
}

int open_direct(const std::string& path) {
#ifdef O_DIRECT
  int fd = ::open(path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
  // EINVAL: this filesystem takes no O_DIRECT (tmpfs before Linux 6.6, many FUSE and network
  // ones); any other error is one of this open, not a refusal
  if (fd < 0 && errno != EINVAL) throw_io("open (O_DIRECT)", path, 0, errno);
  return fd;
#else
  (void)path;
  return -1;
#endif
}

void preallocate(int fd, uint64_t size, const std::string& path) {
  if (size == 0) return;
  int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(size));
  if (rc == 0 || rc == EOPNOTSUPP || rc == EINVAL || rc == ENOSYS) return;
  throw_io("fallocate", path, 0, rc);
}

void fdatasync_or_throw(int fd, const std::string& path) {
  while (::fdatasync(fd) != 0) {
    if (errno == EINTR) continue;
    throw_io("fdatasync", path, 0, errno);
  }
}

}  // namespace fastckpt
