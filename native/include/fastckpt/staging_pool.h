// staging_pool.h — a bounded pool of equally sized host chunks, each an IoMemory
// (io_memory.h: aligned, huge pages advised, so the O_DIRECT writes from it go out
// in few, large requests). Chunks are allocated only when the owner grows the pool
// (so the owner can pin them, e.g. with cudaHostRegister) and are reused until free_all().
// acquire() blocks (GIL released by the binding) until a chunk is free. Growing faults each new
// chunk in outside the pool's lock: writes drawing and freeing chunks meanwhile never wait for it.
// Definitions: src/staging_pool.cc.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "fastckpt/file_io.h"  // kAlign
#include "fastckpt/io_memory.h"

namespace fastckpt {

class StagingPool {
 public:
  // chunk_bytes: a positive multiple of kAlign (throws std::invalid_argument otherwise).
  explicit StagingPool(size_t chunk_bytes);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // Allocates n more chunks; returns their addresses.
  std::vector<uintptr_t> grow(size_t n);

  // Returns a free slot, or -1 after timeout_s (< 0: wait forever).
  int acquire(double timeout_s);

  void release(int slot);

  // The chunk's memory (it stays put while the pool grows: chunks_ only moves its handles).
  uint8_t* data(int slot) const;
  size_t chunk_bytes() const { return chunk_bytes_; }
  size_t capacity() const;
  size_t free_count() const;
  std::vector<uintptr_t> addresses() const;

  // Frees every chunk; refuses while any chunk is still in use.
  void free_all();

 private:
  const size_t chunk_bytes_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<IoMemory> chunks_;
  std::vector<int> free_;
};

}  // namespace fastckpt
