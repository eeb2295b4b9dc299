// write_job.h — one checkpoint file being written: its layout (pieces of raw memory and
// where they go in the file), where its bytes come from (its Source: staged through the
// engine's staging chunks, direct from the caller's memory, or chunks the caller fills
// itself, e.g. from a CUDA stream), the CRC of every byte, and its Sink (sink.h: a file,
// or a region of a mapped pool), which it only puts bytes into, persists and finishes.
// Source x sink, as in the Python write path. Progress is three latches: "copied" (the caller
// may overwrite its tensors), "summed" (every CRC is known: the file's headers can be built) and
// "written" (all data is in the sink). A staged chunk goes to the writers in slices, each as soon
// as it is copied, while they have little else to put (at the start of every checkpoint): the
// disk does not wait for a whole chunk's copy.
// A held job (layer-wise checkpointing) copies nothing until the caller
// releases records; each record's copy can then be waited on alone.
// No wait here is unbounded: every one takes a timeout (the Python write path calls them in
// slices under its deadline), and a copy thread waiting for a staging chunk gives up once the
// job has failed.
// Each job also times its phases (timings()): the seconds its threads spent copying into
// staging, waiting for a free staging chunk, summing CRCs, putting bytes into the sink,
// persisting them, opening and finishing the sink — summed over the threads that ran them —
// and when its "copied" and "written" latches fell (CLOCK_MONOTONIC seconds: Python's
// time.monotonic()), so a caller can say where a checkpoint's time went.
// Definitions: src/write_job.cc.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fastckpt/sink.h"
#include "fastckpt/staging_pool.h"
#include "fastckpt/thread_pool.h"

namespace fastckpt {

// A contiguous run of source bytes and its place in the file.
struct Piece {
  uintptr_t src;
  uint64_t len;
  uint64_t file_off;
  uint32_t record;
};

// Where a job's bytes come from.
enum class Source : int {
  Staged = 0,    // copy threads fill staging chunks from the pieces; each chunk is then put
  Direct = 1,    // each span is put straight from the caller's memory (no staging)
  External = 2,  // the caller fills staging chunks (e.g. from a CUDA stream) and pushes them
};

// What a job runs on: its engine's staging, copy, writer and CRC threads, and the engine's
// progress counter (bumped by every unit copied or written, so a waiter can tell a slow
// checkpoint from a stuck one). A staged chunk is summed on a CRC thread while a writer puts
// it (a CRC thread too where the put is a CPU copy: Sink::put_is_cpu_copy): the disk never
// waits for a CRC. CRC tasks wait for nothing, so a chunk's slot is always
// freed (a copy thread waiting for a slot cannot starve them).
class WriteJob;

// The jobs of one engine holding CRCs back until their copy is done (their chunks held until the CRCs
// run): a copy that would wait for a free chunk of the engine's pool hands every one's on (another
// job's copy may be queued behind it on the same copy threads).
struct HeldSums {
  std::mutex mu;
  std::vector<std::weak_ptr<WriteJob>> jobs;
};

struct Workers {
  StagingPool* pool;
  ThreadPool* copiers;
  ThreadPool* writers;
  ThreadPool* summers;
  std::atomic<uint64_t>* progress;
  HeldSums* held_sums = nullptr;  // none: a job's CRCs run as its chunks are copied
};

// Nanoseconds per phase, added to by every thread of a job (see timings()).
struct JobTimings {
  std::atomic<uint64_t> copy{0}, chunk_wait{0}, crc{0}, put{0}, persist{0}, open{0}, finish{0};
  std::atomic<int64_t> copied_at{-1}, written_at{-1};  // steady-clock ns when the latch fell
};

// Adds the time from its construction to its destruction to one phase of a JobTimings.
class PhaseTimer {
 public:
  explicit PhaseTimer(std::atomic<uint64_t>& into) : into_(into), t0_(std::chrono::steady_clock::now()) {}
  ~PhaseTimer() {
    into_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_)
                        .count(),
                    std::memory_order_relaxed);
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  std::atomic<uint64_t>& into_;
  std::chrono::steady_clock::time_point t0_;
};

class WriteJob : public std::enable_shared_from_this<WriteJob> {
 public:
  // split_bytes: the largest span a Direct job puts at once (Staged and External jobs work
  // in the staging pool's chunks).
  WriteJob(Workers w, std::unique_ptr<Sink> sink, std::vector<Piece> pieces, uint64_t data_begin,
           uint64_t data_end, uint64_t file_size, Source source, uint64_t split_bytes,
           uint32_t n_records, bool held = false);
  ~WriteJob();

  void start();
  void push_chunk(size_t chunk, int slot);  // External source
  bool wait_copied(double timeout_s);       // true when copied (throws the job's error)
  // True when every data byte is in the sink and the sink is open (throws the job's error).
  bool wait_written(double timeout_s);
  // True when every span's CRC is known (throws the job's error): record_crcs() may be read. A
  // staged job sums a chunk beside its put, so this falls while the last bytes are still being
  // written: the caller builds the file's headers then, not after the disk is done.
  bool wait_summed(double timeout_s);
  // Held jobs: start copying (putting, from a Direct source) the units holding these records.
  void release(const std::vector<uint32_t>& records);
  void release_all();
  // True when every unit holding these records is copied (throws the job's error).
  bool wait_records_copied(const std::vector<uint32_t>& records, double timeout_s);
  // After wait_written(): the sink's finish (a file: headers, ftruncate, fdatasync).
  void finalize(const std::vector<std::pair<uint64_t, std::string>>& blobs, uint64_t file_size);
  // Fails the job (the first error wins) and waits up to timeout_s (< 0: no limit) until none
  // of its tasks runs; false when one is still running then (e.g. stuck in the kernel).
  bool abort(const std::string& why, double timeout_s);
  // One line for error messages: units copied and written, tasks running, sink state.
  std::string status() const;

  size_t n_chunks() const { return n_chunks_; }
  uint64_t chunk_begin(size_t c) const { return data_begin_ + c * chunk_bytes_; }
  uint64_t chunk_len(size_t c) const;
  std::vector<uint32_t> record_crcs() const;
  // (record, file offset, length, crc) of every span, in file order.
  std::vector<std::tuple<uint32_t, uint64_t, uint64_t, uint32_t>> span_crcs() const;
  bool used_direct_io() const { return sink_->used_direct_io(); }
  bool direct_io_refused() const { return sink_->direct_io_refused(); }
  uint64_t bytes_written() const { return bytes_written_.load(); }
  // (phase, seconds) of every phase: copy, chunk_wait, crc, put, persist, open, finish summed
  // over the threads that ran them; copied_at and written_at in steady-clock seconds (-1: not yet).
  std::vector<std::pair<std::string, double>> timings() const;
  // The spans of chunk c as (source address, offset inside the chunk, length).
  std::vector<std::tuple<uintptr_t, uint64_t, uint64_t>> chunk_layout(size_t c) const;

 private:
  struct Span {
    uintptr_t src;
    uint64_t len;
    uint64_t file_off;
    uint32_t record;
  };
  void copy_chunk(size_t c);
  // A staged chunk is put in slices of 1/kSlicesPerChunk, each as soon as it is copied, while the
  // writers have less than a chunk's bytes to put (put_backlog_): else whole.
  static constexpr uint64_t kSlicesPerChunk = 8;
  uint64_t slice_bytes() const;
  void expect_halves(size_t c, size_t n_puts);
  // Part of a filled chunk to a writer (a CRC thread where the put is a CPU copy); its sum to a CRC thread.
  void submit_put(size_t c, int slot, uint64_t lo, uint64_t len);
  void submit_sum(size_t c, int slot);
  void put_range(size_t c, int slot, uint64_t lo, uint64_t len);
  void sum_chunk(size_t c, int slot);
  void chunk_half_done(size_t c, int slot);  // the last of its puts and its sum frees the slot
  void put_span(size_t i);
  void persist_span(size_t i);
  void sum_stored(size_t i);  // a span's CRC read back where the sink stored it (Sink::stored_at)
  bool per_span() const { return source_ == Source::Direct; }
  void fill_range(size_t c, uint8_t* buf, uint64_t lo, uint64_t hi);
  // A Direct span into a sink that stores on the copy thread (a mapped region), with its CRC
  // in the same pass: block by block, each summed while in this core's cache. Returns the CRC.
  static constexpr uint64_t kCrcBlock = 256 << 10;
  uint32_t put_with_crc(const uint8_t* src, uint64_t len, uint64_t file_off);
  void fail(const std::string& why, int err = 0);
  void fail(const std::exception& e);
  void count_copied(size_t unit);
  void begin_task();
  void submit_unit(size_t unit);
  std::vector<size_t> units_of(const std::vector<uint32_t>& records) const;
  void count_written();
  void count_summed();  // a unit's CRCs are all in span_crc_
  void bump() { w_.progress->fetch_add(1, std::memory_order_relaxed); }
  int acquire_chunk();  // a staging chunk, or -1 once the job has failed
  void flush_sums();    // the deferred CRCs handed to the CRC threads
  void flush_every_job();  // every job's of the engine (a copy about to wait for a free chunk)
  // Waits (under mu_) until done() or the job failed; throws the job's error; false on timeout.
  bool wait_until(const std::function<bool()>& done, double timeout_s);
  bool wait_latch(const size_t& left, double timeout_s);
  void open_sink();
  bool wait_sink();

  Workers w_;
  std::vector<Span> spans_;
  std::vector<size_t> chunk_first_span_;  // spans_[chunk_first_span_[c] .. [c+1])
  std::vector<uint32_t> span_crc_;
  uint64_t data_begin_, data_end_;
  uint64_t chunk_bytes_;
  size_t n_chunks_ = 0;
  Source source_;
  uint32_t n_records_;
  std::unique_ptr<Sink> sink_;
  std::atomic<uint64_t> bytes_written_{0};
  std::atomic<uint64_t> put_backlog_{0};  // bytes handed to the writers and not yet put
  JobTimings timings_;
  void stamp(std::atomic<int64_t>& at);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  size_t copies_left_ = 0, writes_left_ = 0, sums_left_ = 0;
  // Chunks copied whose CRC waits until every chunk is copied (the copy the gate waits for gets the
  // cores first): handed to the CRC threads then, or as soon as the copy would wait for a free chunk.
  std::vector<std::pair<size_t, int>> deferred_sums_;
  size_t running_ = 0;  // tasks submitted to the thread pools and not finished (abort waits for 0)
  // Copy units: chunks (Staged, External) or spans (Direct). 0 held, 1 issued, 2 copied.
  std::vector<uint8_t> unit_state_;
  std::vector<uint8_t> chunk_halves_;  // per chunk: of its puts and its sum, how many are still to end
  std::vector<std::vector<size_t>> record_units_;
  bool held_ = false;
  bool failed_ = false;
  std::string error_;
  int error_errno_ = 0;
  bool finalized_ = false;
  bool sink_ready_ = false;
};

}  // namespace fastckpt
