// engine.h — what one Checkpointer owns natively: the staging pool, the copy
// threads, the writer threads and the CRC threads, shared by every file it has in flight.
// Definitions: src/engine.cc.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fastckpt/mapped_region.h"
#include "fastckpt/sink.h"
#include "fastckpt/staging_pool.h"
#include "fastckpt/thread_pool.h"
#include "fastckpt/write_job.h"

namespace fastckpt {

// The CRC threads, and the puts that copy on the CPU (through the page cache), run at a lower
// priority than training and the copies the caller's gate waits on. The writers do not: their
// puts wait on the device, and a writer woken late to send the next block leaves the disk idle
// (nice 10 writers made a 1 GiB `c` save 0.93x a plain O_DIRECT writer, nice 0 ones 0.97-0.99x,
// on 2 busy cores).
constexpr int kBackgroundNice = 10;

class Engine {
 public:
  Engine(size_t chunk_bytes, size_t copy_threads, size_t write_threads);

  // A job writing the file at `path` from the given source: a FileSink, or with `memory` a
  // MemoryFileSink (a file on tmpfs, stored into through a mapping; direct_io means nothing there).
  std::shared_ptr<WriteJob> submit(const std::string& path, std::vector<Piece> pieces,
                                   uint64_t data_begin, uint64_t data_end, uint64_t file_size,
                                   Source source, bool direct_io, uint32_t n_records,
                                   bool held = false, bool memory = false);
  // A job storing straight from the caller's memory into a mapped region (a MappedSink:
  // file offset f -> region offset f + shift).
  std::shared_ptr<WriteJob> submit_mapped(std::shared_ptr<const MappedRegion> region, uint64_t shift,
                                          std::vector<Piece> pieces, uint64_t data_begin,
                                          uint64_t data_end, uint32_t n_records, bool held);
  StagingPool& pool() { return pool_; }
  // Units copied or written by any job of this engine so far (see Workers).
  uint64_t progress() const { return progress_.load(std::memory_order_relaxed); }
  // Ends the copy and writer threads while nothing is in flight (the next job starts them
  // again): an engine kept for later holds its staging, not its threads.
  void park();
  size_t copy_threads() const { return copiers_.size(); }
  size_t write_threads() const { return writers_.size(); }

 private:
  std::shared_ptr<WriteJob> start(std::unique_ptr<Sink> sink, std::vector<Piece> pieces, uint64_t data_begin,
                                  uint64_t data_end, uint64_t file_size, Source source, uint32_t n_records,
                                  bool held);

  // Destruction runs bottom-up: copiers drain first (they feed writers and CRC threads),
  // then those two (they release chunks), then the pool frees memory.
  std::atomic<uint64_t> progress_{0};
  HeldSums held_sums_;  // the jobs' CRCs held back while they copy (write_job.h)
  StagingPool pool_;
  ThreadPool writers_;
  ThreadPool summers_;  // as many as copiers: summing is memory work like copying
  ThreadPool copiers_;
};

}  // namespace fastckpt
