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

// Each chunk is made (mapped and faulted in: tens of milliseconds for 64 MiB) before the lock is
// taken, so the writes running meanwhile keep drawing and freeing chunks.
std::vector<uintptr_t> StagingPool::grow(size_t n) {
  std::vector<uintptr_t> out;
  for (size_t i = 0; i < n; ++i) {
    IoMemory chunk(chunk_bytes_);  // zeroed and present: no fault in the first snapshot
    out.push_back(reinterpret_cast<uintptr_t>(chunk.data()));
    {
      std::lock_guard<std::mutex> lk(mu_);
      chunks_.push_back(std::move(chunk));
      free_.push_back(static_cast<int>(chunks_.size() - 1));
    }
    cv_.notify_one();
  }
  return out;
}

uint8_t* StagingPool::data(int slot) const {
  std::lock_guard<std::mutex> lk(mu_);
  return chunks_.at(slot).data();
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
