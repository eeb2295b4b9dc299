// write_job.h — one checkpoint file being written: its layout (pieces of raw
// memory and where they go in the file), the copy of those pieces into
// staging chunks (or none, in direct mode), the CRC of every byte, the writes
// into its sink, and the final header blobs + fdatasync. The sink is a file
// (file_target.h) or, in mapped mode, a region of a mapped pool (mapped_sink.h):
// copy threads store straight into it, and the caller writes the headers
// wherever its pool layout keeps them. Progress is two latches: "copied"
// (the caller may overwrite its tensors) and "written" (all data is in the file).
// A held job (layer-wise checkpointing) copies nothing until the caller
// releases records; each record's copy can then be waited on alone.
// No wait here is unbounded: every one takes a timeout (the Python write path calls them in
// slices under its deadline), and a copy thread waiting for a staging chunk gives up once the
// job has failed.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "crc.h"
#include "file_io.h"
#include "file_target.h"
#include "mapped_sink.h"
#include "staging_pool.h"
#include "thread_pool.h"

namespace fastckpt {

// A contiguous run of source bytes and its place in the file.
struct Piece {
  uintptr_t src;
  uint64_t len;
  uint64_t file_off;
  uint32_t record;
};

enum class Mode : int {
  Stage = 0,     // copy threads fill staging chunks, writers drain them
  Direct = 1,    // writers write straight from the source memory
  External = 2,  // the caller fills staging chunks (e.g. a CUDA stream) and pushes them
  Mapped = 3,    // copy threads store straight into a mapped sink; no staging, no file
};

// Where a mapped job's bytes go: file offset f lands at sink offset f + shift (mod 2^64).
struct MappedTarget {
  std::shared_ptr<const MappedSink> sink;
  uint64_t shift = 0;
};

// What a job runs on: its engine's staging, copy and writer threads, and the engine's
// progress counter (bumped by every unit copied or written, so a waiter can tell a slow
// checkpoint from a stuck one).
struct Workers {
  StagingPool* pool;
  ThreadPool* copiers;
  ThreadPool* writers;
  std::atomic<uint64_t>* progress;
};

class WriteJob : public std::enable_shared_from_this<WriteJob> {
 public:
  WriteJob(Workers w, std::string path, std::vector<Piece> pieces, uint64_t data_begin,
           uint64_t data_end, uint64_t file_size, Mode mode, bool direct_io, uint64_t split_bytes,
           uint32_t n_records, bool held = false, MappedTarget target = {});
  ~WriteJob();

  void start();
  void push_chunk(size_t chunk, int slot);  // External mode
  bool wait_copied(double timeout_s);       // true when copied (throws the job's error)
  // True when every data byte is written and the file is open (throws the job's error).
  bool wait_written(double timeout_s);
  // Held jobs: start copying (writing, in direct mode) the units holding these records.
  void release(const std::vector<uint32_t>& records);
  void release_all();
  // True when every unit holding these records is copied (throws the job's error).
  bool wait_records_copied(const std::vector<uint32_t>& records, double timeout_s);
  // After wait_written(): headers, ftruncate, fdatasync.
  void finalize(const std::vector<std::pair<uint64_t, std::string>>& blobs, uint64_t file_size);
  // Fails the job (the first error wins) and waits up to timeout_s (< 0: no limit) until none
  // of its tasks runs; false when one is still running then (e.g. stuck in the kernel).
  bool abort(const std::string& why, double timeout_s);
  // One line for error messages: units copied and written, tasks running, file state.
  std::string status() const;

  size_t n_chunks() const { return n_chunks_; }
  uint64_t chunk_begin(size_t c) const { return data_begin_ + c * chunk_bytes_; }
  uint64_t chunk_len(size_t c) const;
  std::vector<uint32_t> record_crcs() const;
  // (record, file offset, length, crc) of every span, in file order.
  std::vector<std::tuple<uint32_t, uint64_t, uint64_t, uint32_t>> span_crcs() const;
  bool used_direct_io() const { return file_ && file_->used_direct_io(); }
  uint64_t bytes_written() const { return bytes_written_.load(); }
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
  void write_chunk(size_t c, int slot);
  void write_span(size_t i);
  void map_span(size_t i);
  bool per_span() const { return mode_ == Mode::Direct || mode_ == Mode::Mapped; }
  void fill_chunk(size_t c, uint8_t* buf);
  void fail(const std::string& why, int err = 0);
  void fail(const std::exception& e);
  void count_copied(size_t unit);
  void begin_task();
  void submit_unit(size_t unit);
  std::vector<size_t> units_of(const std::vector<uint32_t>& records) const;
  void count_written();
  void bump() { w_.progress->fetch_add(1, std::memory_order_relaxed); }
  int acquire_chunk();  // a staging chunk, or -1 once the job has failed
  // Waits (under mu_) until done() or the job failed; throws the job's error; false on timeout.
  bool wait_until(const std::function<bool()>& done, double timeout_s);
  bool wait_latch(const size_t& left, double timeout_s);
  void prepare_file();
  bool wait_file();

  Workers w_;
  std::vector<Span> spans_;
  std::vector<size_t> chunk_first_span_;  // spans_[chunk_first_span_[c] .. [c+1])
  std::vector<uint32_t> span_crc_;
  uint64_t data_begin_, data_end_;
  uint64_t chunk_bytes_;
  size_t n_chunks_ = 0;
  Mode mode_;
  uint32_t n_records_;
  std::unique_ptr<FileTarget> file_;  // the file sink (none in mapped mode)
  std::atomic<uint64_t> bytes_written_{0};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  size_t copies_left_ = 0, writes_left_ = 0;
  size_t running_ = 0;  // tasks submitted to the thread pools and not finished (abort waits for 0)
  // Copy units: chunks (stage mode) or spans (direct mode). 0 held, 1 issued, 2 copied.
  std::vector<uint8_t> unit_state_;
  std::vector<std::vector<size_t>> record_units_;
  bool held_ = false;
  bool failed_ = false;
  std::string error_;
  int error_errno_ = 0;
  bool finalized_ = false;
  bool file_ready_ = false;
  MappedTarget target_;
};

}  // namespace fastckpt
