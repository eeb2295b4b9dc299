// file_io.h — full-length pwrite/pread loops, fsync helpers and O_DIRECT
// probing, each turning a failing syscall into an exception whose message
// names the file, the offset and the errno.
#pragma once
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace fastckpt {

inline std::string errno_text(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

class IoError : public std::runtime_error {
 public:
  IoError(const std::string& what, int err) : std::runtime_error(what), err_(err) {}
  int err() const { return err_; }

 private:
  int err_;
};

[[noreturn]] inline void throw_io(const char* op, const std::string& path, uint64_t off, int err) {
  throw IoError(std::string(op) + " failed on '" + path + "' at offset " + std::to_string(off) +
                    ": " + errno_text(err),
                err);
}

// Writes all n bytes or throws. Returns false (writing nothing) when the
// kernel refuses the write with EINVAL, which is how O_DIRECT says "not here".
inline bool pwrite_full(int fd, const void* buf, size_t n, uint64_t off, const std::string& path,
                        bool einval_ok = false) {
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

// Reads exactly n bytes or throws (a short file is an error).
inline void pread_full(int fd, void* buf, size_t n, uint64_t off, const std::string& path) {
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

inline int open_or_throw(const std::string& path, int flags, mode_t mode = 0644) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  if (fd < 0) throw_io("open", path, 0, errno);
  return fd;
}

// Closes a file descriptor when it goes out of scope (also when an exception leaves).
class UniqueFd {
 public:
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Opens path a second time with O_DIRECT; -1 where the filesystem refuses it.
inline int open_direct(const std::string& path) {
#ifdef O_DIRECT
  int fd = ::open(path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
  return fd;  // -1 on EINVAL (tmpfs and friends)
#else
  (void)path;
  return -1;
#endif
}

inline constexpr bool has_o_direct() {
#ifdef O_DIRECT
  return true;
#else
  return false;
#endif
}

// Reserves the file's blocks up front so a full disk fails before any data
// moves. Filesystems without fallocate are left alone.
inline void preallocate(int fd, uint64_t size, const std::string& path) {
  if (size == 0) return;
  int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(size));
  if (rc == 0 || rc == EOPNOTSUPP || rc == EINVAL || rc == ENOSYS) return;
  throw_io("fallocate", path, 0, rc);
}

inline void fdatasync_or_throw(int fd, const std::string& path) {
  while (::fdatasync(fd) != 0) {
    if (errno == EINTR) continue;
    throw_io("fdatasync", path, 0, errno);
  }
}

// What O_DIRECT needs aligned (offsets, lengths, buffers); staging chunks are aligned to it.
constexpr size_t kAlign = 4096;

inline uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace fastckpt
