// file_target.h — the file a write job's bytes go to (the file sink; mapped_sink.h is the other).
// Created, preallocated and opened (also with O_DIRECT when asked) by open(), which the job runs
// on a writer thread; written block by block — O_DIRECT where a block is aligned and allowed,
// buffered otherwise, and buffered for good once the kernel has refused O_DIRECT on this file;
// finished with the header blobs, ftruncate and fdatasync. Knows nothing of chunks or records.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fastckpt {

class FileTarget {
 public:
  FileTarget(std::string path, uint64_t file_size, bool direct_io);
  ~FileTarget();
  FileTarget(const FileTarget&) = delete;
  FileTarget& operator=(const FileTarget&) = delete;

  void open();  // throws IoError
  bool is_open() const { return fd_ >= 0; }
  // Writes len bytes of buf at off; true when O_DIRECT carried them (throws IoError).
  bool write_block(const void* buf, uint64_t len, uint64_t off, bool may_direct);
  // Header blobs at their offsets, the final size, fdatasync; then closed (throws IoError).
  void finish(const std::vector<std::pair<uint64_t, std::string>>& blobs, uint64_t file_size);
  bool used_direct_io() const { return direct_used_.load(); }
  void close();

 private:
  std::string path_;
  uint64_t size_;
  bool direct_io_;
  int fd_ = -1, fd_direct_ = -1;
  std::atomic<bool> direct_used_{false};
  std::atomic<bool> direct_refused_{false};
};

}  // namespace fastckpt
