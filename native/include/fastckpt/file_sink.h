// file_sink.h — the file a write job's bytes go to (a Sink, sink.h; mapped_sink.h is the other).
// Created, preallocated and opened (also with O_DIRECT when asked) by open(), which the job runs
// on a writer thread; written block by block on writer threads — O_DIRECT where a block is
// aligned and allowed, buffered otherwise, and buffered for good once the kernel has refused
// O_DIRECT on this file (at open or at a write: direct_io_refused() says so, and the Python
// side counts and warns); durable at finish(): the header blobs, ftruncate and fdatasync.
// Knows nothing of chunks or records. Definitions: src/file_sink.cc.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fastckpt/sink.h"

namespace fastckpt {

class FileSink final : public Sink {
 public:
  FileSink(std::string path, uint64_t file_size, bool direct_io);
  ~FileSink() override;
  FileSink(const FileSink&) = delete;
  FileSink& operator=(const FileSink&) = delete;

  void check_extent(uint64_t begin, uint64_t end, uint64_t file_size) const override;
  bool needs_open() const override { return true; }
  void open() override;  // throws IoError
  bool is_open() const { return fd_ >= 0; }
  void put(const void* src, uint64_t len, uint64_t off, bool may_direct) override { write_block(src, len, off, may_direct); }
  bool put_on_copy_thread() const override { return false; }
  bool put_is_cpu_copy() const override { return !direct_io_ || direct_refused_.load(); }
  void persist(uint64_t, uint64_t) override {}  // the whole file is made durable by finish()
  bool persist_with_put() const override { return true; }
  // Writes len bytes of buf at off; true when O_DIRECT carried them (throws IoError).
  bool write_block(const void* buf, uint64_t len, uint64_t off, bool may_direct);
  // Header blobs at their offsets, the final size, fdatasync; then closed (throws IoError).
  void finish(const std::vector<std::pair<uint64_t, std::string>>& blobs, uint64_t file_size) override;
  bool used_direct_io() const override { return direct_used_.load(); }
  bool direct_io_refused() const override { return direct_refused_.load(); }
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
