// file_io.h — full-length pwrite/pread loops, fsync helpers and O_DIRECT
// probing, each turning a failing syscall into an exception whose message
// names the file, the offset and the errno. Definitions: src/file_io.cc.
#pragma once
#include <fcntl.h>  // O_DIRECT, and the O_* flags callers pass to open_or_throw
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>  // the E* codes an IoError carries
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace fastckpt {

// strerror(err) followed by "(errno N)".
std::string errno_text(int err);

class IoError : public std::runtime_error {
 public:
  IoError(const std::string& what, int err) : std::runtime_error(what), err_(err) {}
  int err() const { return err_; }

 private:
  int err_;
};

// Throws an IoError "<op> failed on '<path>' at offset <off>: <errno text>".
[[noreturn]] void throw_io(const char* op, const std::string& path, uint64_t off, int err);

// Writes all n bytes or throws. Returns false (writing nothing) when the
// kernel refuses the write with EINVAL, which is how O_DIRECT says "not here".
bool pwrite_full(int fd, const void* buf, size_t n, uint64_t off, const std::string& path,
                 bool einval_ok = false);

// Reads exactly n bytes or throws (a short file is an error).
void pread_full(int fd, void* buf, size_t n, uint64_t off, const std::string& path);

// open(2) with O_CLOEXEC added; throws an IoError naming the path.
int open_or_throw(const std::string& path, int flags, mode_t mode = 0644);

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

// Opens (creating) a file that will hold `size` bytes, cut down to size when longer (a recycled
// file keeps the pages it holds up to there; nothing beyond); throws an IoError naming the path.
int open_cut_to(const std::string& path, int flags, uint64_t size);

// Opens path a second time with O_DIRECT; -1 where the filesystem refuses it (EINVAL); throws
// IoError on any other error.
int open_direct(const std::string& path);

constexpr bool has_o_direct() {
#ifdef O_DIRECT
  return true;
#else
  return false;
#endif
}

// Reserves the file's blocks up front so a full disk fails before any data
// moves. Filesystems without fallocate are left alone.
void preallocate(int fd, uint64_t size, const std::string& path);

// fdatasync(2), retried on EINTR; throws an IoError naming the path.
void fdatasync_or_throw(int fd, const std::string& path);

// What O_DIRECT needs aligned (offsets, lengths, buffers); staging chunks are aligned to it.
constexpr size_t kAlign = 4096;

inline uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace fastckpt
