// staging_pool.h — a bounded pool of equally sized, 4096-aligned host chunks.
// Chunks are allocated only when the owner grows the pool (so the owner can
// pin them, e.g. with cudaHostRegister) and are reused until free_all().
// acquire() blocks (GIL released by the binding) until a chunk is free.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <vector>

#include "fastckpt/file_io.h"  // kAlign

namespace fastckpt {

class StagingPool {
 public:
  explicit StagingPool(size_t chunk_bytes) : chunk_bytes_(chunk_bytes) {
    if (chunk_bytes == 0 || chunk_bytes % kAlign != 0)
      throw std::invalid_argument("staging chunk size must be a positive multiple of 4096 bytes");
  }
  ~StagingPool() {
    for (void* p : chunks_) std::free(p);
  }
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // Allocates n more chunks; returns their addresses.
  std::vector<uintptr_t> grow(size_t n) {
    std::vector<uintptr_t> out;
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t i = 0; i < n; ++i) {
      void* p = nullptr;
      if (posix_memalign(&p, kAlign, chunk_bytes_) != 0) throw std::bad_alloc();
      std::memset(p, 0, chunk_bytes_);  // fault the pages in now, not in the first snapshot
      chunks_.push_back(p);
      free_.push_back(static_cast<int>(chunks_.size() - 1));
      out.push_back(reinterpret_cast<uintptr_t>(p));
    }
    cv_.notify_all();
    return out;
  }

  // Returns a free slot, or -1 after timeout_s (< 0: wait forever).
  int acquire(double timeout_s) {
    std::unique_lock<std::mutex> lk(mu_);
    auto ready = [this] { return !free_.empty(); };
    if (timeout_s < 0) {
      cv_.wait(lk, ready);
    } else if (!cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), ready)) {
      return -1;
    }
    int slot = free_.back();
    free_.pop_back();
    return slot;
  }

  void release(int slot) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      free_.push_back(slot);
    }
    cv_.notify_one();
  }

  uint8_t* data(int slot) const { return static_cast<uint8_t*>(chunks_.at(slot)); }
  size_t chunk_bytes() const { return chunk_bytes_; }
  size_t capacity() const {
    std::lock_guard<std::mutex> lk(mu_);
    return chunks_.size();
  }
  size_t free_count() const {
    std::lock_guard<std::mutex> lk(mu_);
    return free_.size();
  }
  std::vector<uintptr_t> addresses() const {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<uintptr_t> out;
    for (void* p : chunks_) out.push_back(reinterpret_cast<uintptr_t>(p));
    return out;
  }

  // Frees every chunk; refuses while any chunk is still in use.
  void free_all() {
    std::lock_guard<std::mutex> lk(mu_);
    if (free_.size() != chunks_.size())
      throw std::runtime_error("staging pool still has chunks in use; wait for checkpoints first");
    for (void* p : chunks_) std::free(p);
    chunks_.clear();
    free_.clear();
  }

 private:
  const size_t chunk_bytes_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<void*> chunks_;
  std::vector<int> free_;
};

}  // namespace fastckpt
