// staging_pool.cc — the definitions of staging_pool.h: allocation and the free list.
#include "fastckpt/staging_pool.h"

#include <chrono>
#include <stdexcept>

namespace fastckpt {

StagingPool::StagingPool(size_t chunk_bytes) : chunk_bytes_(chunk_bytes) {
  if (chunk_bytes == 0 || chunk_bytes % kAlign != 0)
    throw std::invalid_argument("staging chunk size must be a positive multiple of 4096 bytes");
}

StagingPool::~StagingPool() = default;

std::vector<uintptr_t> StagingPool::grow(size_t n) {
  std::vector<uintptr_t> out;
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t i = 0; i < n; ++i) {
    chunks_.emplace_back(chunk_bytes_);  // zeroed and present: no fault in the first snapshot
    free_.push_back(static_cast<int>(chunks_.size() - 1));
    out.push_back(reinterpret_cast<uintptr_t>(chunks_.back().data()));
  }
  cv_.notify_all();
  return out;
}

int StagingPool::acquire(double timeout_s) {
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

void StagingPool::release(int slot) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    free_.push_back(slot);
  }
  cv_.notify_one();
}

size_t StagingPool::capacity() const {
  std::lock_guard<std::mutex> lk(mu_);
  return chunks_.size();
}

size_t StagingPool::free_count() const {
  std::lock_guard<std::mutex> lk(mu_);
  return free_.size();
}

std::vector<uintptr_t> StagingPool::addresses() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<uintptr_t> out;
  for (const IoMemory& c : chunks_) out.push_back(reinterpret_cast<uintptr_t>(c.data()));
  return out;
}

void StagingPool::free_all() {
  std::lock_guard<std::mutex> lk(mu_);
  if (free_.size() != chunks_.size())
    throw std::runtime_error("staging pool still has chunks in use; wait for checkpoints first");
  chunks_.clear();
  free_.clear();
}

}  // namespace fastckpt
