// file_sink.cc — the definitions of file_sink.h: the file sink of a write job.
#include "fastckpt/file_sink.h"

#include <sys/stat.h>
#include <unistd.h>

#include <stdexcept>

#include "fastckpt/file_io.h"

namespace fastckpt {

FileSink::FileSink(std::string path, uint64_t file_size, bool direct_io)
    : path_(std::move(path)), size_(file_size), direct_io_(direct_io) {}

FileSink::~FileSink() { close(); }

void FileSink::check_extent(uint64_t, uint64_t end, uint64_t file_size) const {
  if (end > file_size) throw std::invalid_argument("data extent past end of file");
}

void FileSink::close() {
  if (fd_direct_ >= 0) ::close(fd_direct_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd_direct_ = -1;
}

void FileSink::open() {
  // Not truncated: a file already at path (a memory tier's recycled part) keeps the pages it holds,
  // which the write fills again (every byte of [0, size) is written: headers, records, padding);
  // beyond size, nothing is kept.
  fd_ = open_cut_to(path_, O_WRONLY, size_);
  preallocate(fd_, size_, path_);
  if (direct_io_) {
    fd_direct_ = open_direct(path_);
    if (fd_direct_ < 0) direct_refused_ = true;  // EINVAL: this filesystem takes no O_DIRECT (else it threw)
  }
}

bool FileSink::write_block(const void* buf, uint64_t len, uint64_t off, bool may_direct) {
  if (may_direct && fd_direct_ >= 0 && !direct_refused_.load()) {
    if (pwrite_full(fd_direct_, buf, round_up(len, kAlign), off, path_, true)) {
      direct_used_ = true;
      return true;
    }
    direct_refused_ = true;  // the fd stays open until close(): other writers may hold it
  }
  pwrite_full(fd_, buf, len, off, path_);
  return false;
}

void FileSink::finish(const std::vector<std::pair<uint64_t, std::string>>& blobs, uint64_t file_size) {
  if (fd_ < 0) throw std::logic_error("file was never opened");
  for (const auto& [off, bytes] : blobs) pwrite_full(fd_, bytes.data(), bytes.size(), off, path_);
  if (::ftruncate(fd_, static_cast<off_t>(file_size)) != 0) throw_io("ftruncate", path_, 0, errno);
  fdatasync_or_throw(fd_, path_);
  close();
}

}  // namespace fastckpt
