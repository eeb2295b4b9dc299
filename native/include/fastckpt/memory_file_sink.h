// memory_file_sink.h — a file on a memory filesystem (tmpfs: a memory tier's part) as a write
// job's sink (sink.h). open() creates it (or takes the recycled file already there, cut down to
// the size it will have, never truncated to nothing) and takes a mapping of it from the process's
// registry (memory_maps.h): every page reserved (a full tier is an error here, never a SIGBUS at a
// store) and present — for a recycled file, the mapping its last save left there.
// Bytes are then stored into the mapping with a memcpy instead of a write(): from staging chunks on
// the CRC threads (a copy off the gate: Sink::put_is_cpu_copy), or straight from the caller's
// memory on the copy threads (stored_at(): the job sums them afterwards where they landed, on a
// CRC thread, so that the gate waits for the copy alone). write() into tmpfs costs the kernel a
// page lookup and lock per 4 KiB on top of the copy; the mapping costs the copy alone.
// No descriptor stays open once the file is mapped (a forked child must not inherit one).
// finish(): the header blobs, the mapping given back (held on for the copy to the disk), the final
// size. Definitions: src/memory_file_sink.cc.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "fastckpt/sink.h"

namespace fastckpt {

class MemoryFileSink final : public Sink {
 public:
  MemoryFileSink(std::string path, uint64_t file_size);
  ~MemoryFileSink() override;
  MemoryFileSink(const MemoryFileSink&) = delete;
  MemoryFileSink& operator=(const MemoryFileSink&) = delete;

  void check_extent(uint64_t begin, uint64_t end, uint64_t file_size) const override;
  bool needs_open() const override { return true; }
  void open() override;  // throws IoError (ENOSPC when the tier has no room)
  void put(const void* src, uint64_t len, uint64_t off, bool) override { std::memcpy(map_ + off, src, len); }
  bool put_on_copy_thread() const override { return true; }
  bool put_is_cpu_copy() const override { return true; }  // a memcpy into the mapping
  void persist(uint64_t, uint64_t) override {}  // memory: nothing below it to reach
  bool persist_with_put() const override { return true; }
  const uint8_t* stored_at(uint64_t off) const override { return map_ != nullptr ? map_ + off : nullptr; }
  void finish(const std::vector<std::pair<uint64_t, std::string>>& blobs, uint64_t file_size) override;

 private:
  void close();
  std::string path_;
  uint64_t size_;
  bool opened_ = false;
  uint8_t* map_ = nullptr;
};

// Whether path (a file or folder) lies on a memory filesystem (tmpfs) where a MemoryFileSink
// belongs; false when it cannot be told.
bool on_memory_filesystem(const std::string& path);

}  // namespace fastckpt
