// file_sink.cc — the definitions of file_sink.h: the file sink of a write job.
#include "fastckpt/file_sink.h"

#include <fcntl.h>
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

// The blobs (headers, whose CRCs are known only now) are written through the page cache. A blob
// that covers part of a page the writers already put on the disk makes the kernel read that page
// first, one synchronous read per pwrite: with a header beside every record (hundreds of tensors,
// or DCP's archive per tensor) that was 0.1 ms a record after the last byte (300 records: 33 ms).
// Every such page is asked for at once first (readahead of the partial pages, in flight together);
// the pwrites then find them in the cache.
void FileSink::finish(const std::vector<std::pair<uint64_t, std::string>>& blobs, uint64_t file_size) {
  if (fd_ < 0) throw std::logic_error("file was never opened");
  for (const auto& [off, bytes] : blobs) {
    const uint64_t end = off + bytes.size();
    const uint64_t head = off / kAlign * kAlign, tail = end / kAlign * kAlign;
    if (bytes.empty()) continue;
    if (off != head || end < head + kAlign) ::posix_fadvise(fd_, static_cast<off_t>(head), kAlign, POSIX_FADV_WILLNEED);
    if (end != tail && tail != head) ::posix_fadvise(fd_, static_cast<off_t>(tail), kAlign, POSIX_FADV_WILLNEED);
  }
  for (const auto& [off, bytes] : blobs) pwrite_full(fd_, bytes.data(), bytes.size(), off, path_);
  if (::ftruncate(fd_, static_cast<off_t>(file_size)) != 0) throw_io("ftruncate", path_, 0, errno);
  fdatasync_or_throw(fd_, path_);
  close();
}

}  // namespace fastckpt
