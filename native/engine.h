// engine.h — what one Checkpointer owns natively: the staging pool, the copy
// threads and the writer threads, shared by every file it has in flight.
#pragma once
#include <atomic>
#include <memory>

#include "staging_pool.h"
#include "thread_pool.h"
#include "write_job.h"

namespace fastckpt {

// Writers (CRC + I/O) run at a lower priority than the copies the caller's gate waits on.
constexpr int kWriterNice = 10;

class Engine {
 public:
  Engine(size_t chunk_bytes, size_t copy_threads, size_t write_threads)
      : pool_(chunk_bytes), writers_(write_threads, kWriterNice), copiers_(copy_threads) {}

  std::shared_ptr<WriteJob> submit(const std::string& path, std::vector<Piece> pieces,
                                   uint64_t data_begin, uint64_t data_end, uint64_t file_size,
                                   Mode mode, bool direct_io, uint32_t n_records,
                                   bool held = false) {
    auto job = std::make_shared<WriteJob>(Workers{&pool_, &copiers_, &writers_, &progress_}, path,
                                          std::move(pieces), data_begin, data_end, file_size, mode,
                                          direct_io, pool_.chunk_bytes(), n_records, held);
    job->start();
    return job;
  }
  // A job that stores straight into a mapped sink (file offset f -> sink offset f + shift).
  std::shared_ptr<WriteJob> submit_mapped(std::shared_ptr<const MappedSink> target, uint64_t shift,
                                          std::vector<Piece> pieces, uint64_t data_begin,
                                          uint64_t data_end, uint32_t n_records, bool held) {
    const std::string path = target->path();  // before target is moved from
    auto job = std::make_shared<WriteJob>(Workers{&pool_, &copiers_, &writers_, &progress_}, path,
                                          std::move(pieces), data_begin, data_end, data_end,
                                          Mode::Mapped, false, pool_.chunk_bytes(), n_records, held,
                                          MappedTarget{std::move(target), shift});
    job->start();
    return job;
  }
  StagingPool& pool() { return pool_; }
  // Units copied or written by any job of this engine so far (see Workers).
  uint64_t progress() const { return progress_.load(std::memory_order_relaxed); }
  size_t copy_threads() const { return copiers_.size(); }
  size_t write_threads() const { return writers_.size(); }

 private:
  // Destruction runs bottom-up: copiers drain first (they feed writers), then
  // writers (they release chunks), then the pool frees memory.
  std::atomic<uint64_t> progress_{0};
  StagingPool pool_;
  ThreadPool writers_;
  ThreadPool copiers_;
};

}  // namespace fastckpt
