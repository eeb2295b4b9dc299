// write_job.cc — the definitions of write_job.h: the copy/CRC/write pipeline of one checkpoint file.
#include "fastckpt/write_job.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "fastckpt/crc.h"
#include "fastckpt/file_io.h"
#include "fastckpt/stream_copy.h"

namespace fastckpt {

WriteJob::WriteJob(Workers w, std::unique_ptr<Sink> sink, std::vector<Piece> pieces,
                   uint64_t data_begin, uint64_t data_end, uint64_t file_size, Source source,
                   uint64_t split_bytes, uint32_t n_records, bool held)
    : w_(w), data_begin_(data_begin), data_end_(data_end),
      chunk_bytes_(source == Source::Direct ? split_bytes : w.pool->chunk_bytes()),
      source_(source), n_records_(n_records), sink_(std::move(sink)) {
  if (!sink_) throw std::invalid_argument("a write job needs a sink");
  if (data_end < data_begin) throw std::invalid_argument("data extent ends before it begins");
  sink_->check_extent(data_begin, data_end, file_size);
  sink_ready_ = !sink_->needs_open();
  if (chunk_bytes_ == 0 || chunk_bytes_ % kAlign != 0)
    throw std::invalid_argument("chunk size must be a positive multiple of 4096");
  if (!per_span() && data_begin % kAlign != 0)
    throw std::invalid_argument("data must start 4096-aligned");
  std::sort(pieces.begin(), pieces.end(),
            [](const Piece& a, const Piece& b) { return a.file_off < b.file_off; });
  uint64_t prev_end = data_begin;
  for (const Piece& p : pieces) {
    if (p.file_off < prev_end || p.file_off + p.len > data_end || p.record >= n_records)
      throw std::invalid_argument("pieces overlap or fall outside the data extent");
    prev_end = p.file_off + p.len;
  }
  n_chunks_ = data_end > data_begin ? (data_end - data_begin + chunk_bytes_ - 1) / chunk_bytes_ : 0;
  // Cut pieces at chunk boundaries (a Direct source: every chunk_bytes of a piece).
  chunk_first_span_.assign(n_chunks_ + 1, 0);
  for (const Piece& p : pieces) {
    uint64_t off = p.file_off, left = p.len;
    while (left > 0) {
      uint64_t c = (off - data_begin) / chunk_bytes_;
      uint64_t room = per_span() ? chunk_bytes_ : chunk_begin(c) + chunk_bytes_ - off;
      uint64_t n = std::min(left, room);
      spans_.push_back({p.src + (off - p.file_off), n, off, p.record});
      off += n;
      left -= n;
    }
  }
  if (pieces.empty()) n_chunks_ = 0;
  if (!per_span()) {
    size_t s = 0;
    for (size_t c = 0; c < n_chunks_; ++c) {
      chunk_first_span_[c] = s;
      while (s < spans_.size() && spans_[s].file_off < chunk_begin(c) + chunk_bytes_) ++s;
    }
    chunk_first_span_[n_chunks_] = spans_.size();
  }
  span_crc_.assign(spans_.size(), 0);
  if (per_span()) {
    copies_left_ = writes_left_ = sums_left_ = spans_.size();
  } else {
    copies_left_ = source == Source::Staged ? n_chunks_ : 0;
    writes_left_ = sums_left_ = n_chunks_;
  }
  if (held && source == Source::External) throw std::invalid_argument("external jobs cannot be held");
  held_ = held;
  const size_t n_units = per_span() ? spans_.size() : n_chunks_;
  unit_state_.assign(n_units, held ? 0 : 1);
  chunk_halves_.assign(per_span() ? 0 : n_chunks_, 0);
  record_units_.assign(n_records, {});
  for (size_t u = 0; u < n_units; ++u) {
    size_t lo = per_span() ? u : chunk_first_span_[u];
    size_t hi = per_span() ? u + 1 : chunk_first_span_[u + 1];
    for (size_t s = lo; s < hi; ++s) {
      auto& units = record_units_[spans_[s].record];
      if (units.empty() || units.back() != u) units.push_back(u);
    }
  }
}

WriteJob::~WriteJob() = default;

uint64_t WriteJob::chunk_len(size_t c) const {
  return std::min(chunk_bytes_, data_end_ - chunk_begin(c));
}

// Opening the sink (creating and reserving a file) is off the caller's thread: on a writer, or on a
// copy thread for a sink the copy threads put into.
void WriteJob::open_sink() {
  try {
    PhaseTimer t(timings_.open);
    sink_->open();
  } catch (const std::exception& e) {
    fail(e);
  }
  std::lock_guard<std::mutex> lk(mu_);
  sink_ready_ = true;
  --running_;
  bump();
  cv_.notify_all();
}

// Waits for open_sink(); false when the job has failed.
bool WriteJob::wait_sink() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [this] { return sink_ready_ || failed_; });
  return !failed_;
}

void WriteJob::start() {
  auto self = shared_from_this();
  if (sink_->needs_open()) {
    begin_task();
    // FIFO: before any put of this job. A sink the copy threads put into is opened on them too: the
    // gate waits for its open.
    (sink_->put_on_copy_thread() ? w_.copiers : w_.writers)->submit([self] { self->open_sink(); });
  }
  if (!held_ && source_ != Source::External)
    for (size_t u = 0; u < unit_state_.size(); ++u) submit_unit(u);
}

void WriteJob::begin_task() {
  std::lock_guard<std::mutex> lk(mu_);
  ++running_;
}

void WriteJob::submit_unit(size_t u) {
  begin_task();
  auto self = shared_from_this();
  if (source_ == Source::Staged)
    w_.copiers->submit([self, u] { self->copy_chunk(u); });
  else  // Direct: the span is put on the threads its sink puts on
    (sink_->put_on_copy_thread() ? w_.copiers : w_.writers)->submit([self, u] { self->put_span(u); });
}

std::vector<size_t> WriteJob::units_of(const std::vector<uint32_t>& records) const {
  std::vector<size_t> out;
  for (uint32_t r : records) {
    if (r >= n_records_) throw std::out_of_range("record index out of range");
    out.insert(out.end(), record_units_[r].begin(), record_units_[r].end());
  }
  return out;
}

void WriteJob::release(const std::vector<uint32_t>& records) {
  std::vector<size_t> go;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t u : units_of(records))
      if (unit_state_[u] == 0) {
        unit_state_[u] = 1;
        go.push_back(u);
      }
  }
  for (size_t u : go) submit_unit(u);
}

void WriteJob::release_all() {
  std::vector<size_t> go;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t u = 0; u < unit_state_.size(); ++u)
      if (unit_state_[u] == 0) {
        unit_state_[u] = 1;
        go.push_back(u);
      }
  }
  for (size_t u : go) submit_unit(u);
}

bool WriteJob::wait_records_copied(const std::vector<uint32_t>& records, double timeout_s) {
  if (source_ == Source::External) throw std::logic_error("external jobs track copies themselves");
  const std::vector<size_t> units = units_of(records);
  return wait_until(
      [&] {
        for (size_t u : units)
          if (unit_state_[u] != 2) return false;
        return true;
      },
      timeout_s);
}

void WriteJob::fail(const std::string& why, int err) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!failed_) {  // the first error wins
    failed_ = true;
    error_ = why;
    error_errno_ = err;
  }
  cv_.notify_all();
}

// An I/O error keeps its errno so Python raises the matching OSError.
void WriteJob::fail(const std::exception& e) {
  const auto* io = dynamic_cast<const IoError*>(&e);
  fail(e.what(), io ? io->err() : 0);
}

// Fails the job, then waits until no task of it is still running: once abort returns, no
// writer touches its file or holds one of its staging chunks (the caller may remove both).
bool WriteJob::abort(const std::string& why, double timeout_s) {
  fail(why);
  std::unique_lock<std::mutex> lk(mu_);
  auto idle = [this] { return running_ == 0; };
  if (timeout_s < 0) {
    cv_.wait(lk, idle);
    return true;
  }
  return cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), idle);
}

std::string WriteJob::status() const {
  std::lock_guard<std::mutex> lk(mu_);
  const size_t units = unit_state_.size();
  size_t held = 0, copied = 0;
  for (uint8_t s : unit_state_) {
    held += s == 0;
    copied += s == 2;
  }
  std::string out = std::to_string(copied) + " of " + std::to_string(units) + " units copied";
  if (held) out += " (" + std::to_string(held) + " still held)";
  const size_t total_writes = per_span() ? spans_.size() : n_chunks_;
  out += ", " + std::to_string(total_writes - writes_left_) + " of " + std::to_string(total_writes) +
         " written, " + std::to_string(running_) + " tasks running";
  if (!sink_ready_) out += ", the sink not yet open";
  return out;
}

void WriteJob::count_copied(size_t unit) {
  bool last;
  {
    std::lock_guard<std::mutex> lk(mu_);
    unit_state_[unit] = 2;
    last = --copies_left_ == 0;
    if (last) stamp(timings_.copied_at);
    bump();
    cv_.notify_all();  // per-record waiters watch single units
  }
  if (last) flush_sums();
}

void WriteJob::count_written() {
  std::lock_guard<std::mutex> lk(mu_);
  --running_;
  bump();
  const bool last = --writes_left_ == 0;
  if (last) stamp(timings_.written_at);
  if (last || running_ == 0) cv_.notify_all();
}

void WriteJob::count_summed() {
  std::lock_guard<std::mutex> lk(mu_);
  if (--sums_left_ == 0) cv_.notify_all();
}

// Staging chunks are freed by writers; a copy waits for one in slices so that a failed job
// (a writer error, or abort() after a stall) lets its copy threads go.
int WriteJob::acquire_chunk() {
  PhaseTimer t(timings_.chunk_wait);
  for (double wait = 0.0;; wait = 0.05) {
    int slot = w_.pool->acquire(wait);
    if (slot >= 0) return slot;
    flush_every_job();  // a chunk is freed once its CRC is done too: none may wait behind a copy now
    std::lock_guard<std::mutex> lk(mu_);
    if (failed_) return -1;
  }
}

// A Direct span into a mapped sink, with its CRC in the same pass over the caller's memory: a
// block is summed, then stored from this core's cache (the gate waits for both either way).
uint32_t WriteJob::put_with_crc(const uint8_t* src, uint64_t len, uint64_t file_off) {
  uint32_t crc = 0;
  for (uint64_t o = 0; o < len; o += kCrcBlock) {
    const uint64_t n = std::min<uint64_t>(kCrcBlock, len - o);
    crc = crc32_update(crc, src + o, n);
    sink_->put(src + o, n, file_off + o, false);
  }
  return crc;
}

// Bytes [lo, hi) of chunk c's staging buffer (offsets inside the chunk): the spans' bytes, and
// zeros between and after them up to hi.
void WriteJob::fill_range(size_t c, uint8_t* buf, uint64_t lo, uint64_t hi) {
  const uint64_t base = chunk_begin(c);
  uint64_t cursor = lo;
  for (size_t s = chunk_first_span_[c]; s < chunk_first_span_[c + 1]; ++s) {
    const Span& sp = spans_[s];
    const uint64_t at = sp.file_off - base;
    if (at >= hi) break;
    const uint64_t from = std::max(at, lo), to = std::min(at + sp.len, hi);
    if (to <= from) continue;
    if (from > cursor) std::memset(buf + cursor, 0, from - cursor);
    copy_past_cache(buf + from, reinterpret_cast<const uint8_t*>(sp.src) + (from - at), to - from);
    cursor = to;
  }
  if (hi > cursor) std::memset(buf + cursor, 0, hi - cursor);
}

// A staged chunk is put in slices, each as soon as it is copied, while the writers have less than
// a chunk's bytes left to put: they would otherwise wait for the whole copy with the disk idle (at
// the start of every checkpoint, and whenever the copies fall behind the disk). A put that is a CPU
// copy gains nothing from it.
uint64_t WriteJob::slice_bytes() const {
  if (sink_->put_is_cpu_copy() || put_backlog_.load() >= chunk_bytes_) return chunk_bytes_;
  return std::max<uint64_t>(kAlign, chunk_bytes_ / kSlicesPerChunk / kAlign * kAlign);
}

void WriteJob::copy_chunk(size_t c) {
  bool skip;
  {
    std::lock_guard<std::mutex> lk(mu_);
    skip = failed_;
  }
  int slot = skip ? -1 : acquire_chunk();
  if (slot < 0) {
    count_copied(c);
    count_written();
    return;
  }
  uint8_t* buf = w_.pool->data(slot);
  const uint64_t end = round_up(chunk_len(c), kAlign);
  const uint64_t slice = std::min(slice_bytes(), end);
  expect_halves(c, static_cast<size_t>((end + slice - 1) / slice));
  for (uint64_t lo = 0; lo < end; lo += slice) {
    const uint64_t hi = std::min(end, lo + slice);
    {
      PhaseTimer t(timings_.copy);
      fill_range(c, buf, lo, hi);
    }
    submit_put(c, slot, lo, std::min(hi, chunk_len(c)) - lo);
  }
  count_copied(c);
  submit_sum(c, slot);
}

// A chunk's slot is freed once each of its puts and its sum has ended ("halves": n_puts + 1). The
// unit's own task is one of them; the others are counted as tasks running here.
void WriteJob::expect_halves(size_t c, size_t n_puts) {
  std::lock_guard<std::mutex> lk(mu_);
  running_ += n_puts;
  chunk_halves_[c] = n_puts + 1;
}

void WriteJob::submit_put(size_t c, int slot, uint64_t lo, uint64_t len) {
  put_backlog_ += len;
  auto self = shared_from_this();
  (sink_->put_is_cpu_copy() ? w_.summers : w_.writers)->submit([self, c, slot, lo, len] {
    self->put_range(c, slot, lo, len);
  });
}

void WriteJob::submit_sum(size_t c, int slot) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    // the copy goes first: this CRC runs once every chunk is copied (a held, layer-wise job's chunks
    // are released as training goes on: its CRCs are not kept waiting for that)
    if (copies_left_ > 0 && !held_ && w_.held_sums != nullptr) {
      if (deferred_sums_.empty()) {
        HeldSums& held = *w_.held_sums;
        std::lock_guard<std::mutex> g(held.mu);
        if (held.jobs.size() >= 64)  // jobs gone since the last flush of every job: forgotten
          held.jobs.erase(std::remove_if(held.jobs.begin(), held.jobs.end(),
                                         [](const std::weak_ptr<WriteJob>& w) { return w.expired(); }),
                          held.jobs.end());
        held.jobs.push_back(weak_from_this());
      }
      deferred_sums_.emplace_back(c, slot);
      return;
    }
  }
  auto self = shared_from_this();
  w_.summers->submit([self, c, slot] { self->sum_chunk(c, slot); });
}

void WriteJob::flush_sums() {
  std::vector<std::pair<size_t, int>> due;
  {
    std::lock_guard<std::mutex> lk(mu_);
    due.swap(deferred_sums_);
  }
  auto self = shared_from_this();
  for (auto [c, slot] : due) w_.summers->submit([self, c = c, slot = slot] { self->sum_chunk(c, slot); });
}

void WriteJob::flush_every_job() {
  if (w_.held_sums == nullptr) return;
  std::vector<std::weak_ptr<WriteJob>> jobs;
  {
    std::lock_guard<std::mutex> g(w_.held_sums->mu);
    jobs.swap(w_.held_sums->jobs);
  }
  for (auto& weak : jobs)
    if (auto job = weak.lock()) job->flush_sums();
}

void WriteJob::chunk_half_done(size_t c, int slot) {
  bool last;
  {
    std::lock_guard<std::mutex> lk(mu_);
    last = --chunk_halves_[c] == 0;
    if (!last && --running_ == 0) cv_.notify_all();
  }
  if (!last) return;
  w_.pool->release(slot);
  count_written();
}

void WriteJob::push_chunk(size_t c, int slot) {
  if (source_ != Source::External) throw std::logic_error("push_chunk is only for external jobs");
  if (c >= n_chunks_) throw std::out_of_range("chunk index out of range");
  begin_task();
  expect_halves(c, 1);
  submit_put(c, slot, 0, chunk_len(c));
  submit_sum(c, slot);
}

// Bytes [lo, lo + len) of a staging chunk into the sink, on a writer thread (it may block in the
// kernel). The chunk's CRC is summed beside it on a CRC thread (sum_chunk), not before it here, so
// the disk never waits for a CRC; and not by the copy, so the gate waits for the copy alone.
void WriteJob::put_range(size_t c, int slot, uint64_t lo, uint64_t len) {
  try {
    if (wait_sink()) {
      const uint8_t* buf = w_.pool->data(slot) + lo;
      const uint64_t at = chunk_begin(c) + lo;
      {
        PhaseTimer t(timings_.put);
        sink_->put(buf, len, at, true);
      }
      {
        PhaseTimer t(timings_.persist);
        sink_->persist(at, len);
      }
      bytes_written_ += len;
    }
  } catch (const std::exception& e) {
    fail(e);
  }
  put_backlog_ -= len;
  chunk_half_done(c, slot);
}

// The CRC of every span of a staging chunk, on a CRC thread, while a writer puts the chunk (both
// only read it). Skipped once the job has failed: its CRCs are never recorded.
void WriteJob::sum_chunk(size_t c, int slot) {
  bool failed;
  {
    std::lock_guard<std::mutex> lk(mu_);
    failed = failed_;
  }
  if (!failed) {
    const uint8_t* buf = w_.pool->data(slot);
    const uint64_t base = chunk_begin(c);
    {
      PhaseTimer t(timings_.crc);
      for (size_t s = chunk_first_span_[c]; s < chunk_first_span_[c + 1]; ++s)
        span_crc_[s] = crc32_update(0, buf + (spans_[s].file_off - base), spans_[s].len);
    }
    count_summed();
  }
  chunk_half_done(c, slot);
}

// A Direct span, straight from the caller's memory into the sink: on a writer thread for a file
// (the pwrite is the copy), on a copy thread for a mapped region. The caller's tensor is free
// once the span is put; persisting runs on the same thread where the sink needs it (a fence:
// non-temporal stores are ordered per thread), else is left to a writer thread (an msync).
// A sink that can show where a span landed (a tmpfs file's mapping) gets the store alone on the
// copy thread; a CRC thread sums the span there afterwards (sum_stored), off the gate.
void WriteJob::put_span(size_t i) {
  bool copied = false;
  try {
    if (wait_sink()) {
      const Span& sp = spans_[i];
      const void* src = reinterpret_cast<const void*>(sp.src);
      const bool aligned = sp.src % kAlign == 0 && sp.file_off % kAlign == 0 && sp.len % kAlign == 0;
      if (sink_->put_on_copy_thread() && sink_->stored_at(sp.file_off) != nullptr) {
        {  // the store alone: a CRC thread sums the bytes where they landed, the gate waits for this
          PhaseTimer t(timings_.put);
          sink_->put(src, sp.len, sp.file_off, false);
        }
        if (sink_->persist_with_put()) {
          PhaseTimer t(timings_.persist);
          sink_->persist(sp.file_off, sp.len);
        }
        count_copied(i);
        copied = true;
        auto self = shared_from_this();
        w_.summers->submit([self, i] { self->sum_stored(i); });
        return;
      }
      if (sink_->put_on_copy_thread()) {  // the CRC and the store in one pass: timed as the put
        {
          PhaseTimer t(timings_.put);
          span_crc_[i] = put_with_crc(reinterpret_cast<const uint8_t*>(sp.src), sp.len, sp.file_off);
        }
        count_summed();
      } else {  // the pwrite is the copy (the kernel's, or the device's with O_DIRECT): sum, then put
        {
          PhaseTimer t(timings_.crc);
          span_crc_[i] = crc32_update(0, src, sp.len);
        }
        count_summed();
        PhaseTimer t(timings_.put);
        sink_->put(src, sp.len, sp.file_off, aligned);
      }
      if (!sink_->persist_with_put()) {
        count_copied(i);
        copied = true;
        auto self = shared_from_this();
        w_.writers->submit([self, i] { self->persist_span(i); });
        return;
      }
      {
        PhaseTimer t(timings_.persist);
        sink_->persist(sp.file_off, sp.len);
      }
      bytes_written_ += sp.len;
    }
  } catch (const std::exception& e) {
    fail(e);
  }
  if (!copied) count_copied(i);
  count_written();
}

void WriteJob::sum_stored(size_t i) {
  try {
    const Span& sp = spans_[i];
    {
      PhaseTimer t(timings_.crc);
      span_crc_[i] = crc32_update(0, sink_->stored_at(sp.file_off), sp.len);
    }
    count_summed();
    if (!sink_->persist_with_put()) {
      PhaseTimer t(timings_.persist);
      sink_->persist(sp.file_off, sp.len);
    }
    bytes_written_ += sp.len;
  } catch (const std::exception& e) {
    fail(e);
  }
  count_written();
}

void WriteJob::persist_span(size_t i) {
  try {
    PhaseTimer t(timings_.persist);
    sink_->persist(spans_[i].file_off, spans_[i].len);
    bytes_written_ += spans_[i].len;
  } catch (const std::exception& e) {
    fail(e);
  }
  count_written();
}

bool WriteJob::wait_until(const std::function<bool()>& done, double timeout_s) {
  std::unique_lock<std::mutex> lk(mu_);
  auto ready = [&] { return failed_ || done(); };
  if (timeout_s < 0) {
    cv_.wait(lk, ready);
  } else if (!cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), ready)) {
    return false;
  }
  if (failed_) {
    if (error_errno_ != 0) throw IoError(error_, error_errno_);
    throw std::runtime_error(error_);
  }
  return true;
}

bool WriteJob::wait_latch(const size_t& left, double timeout_s) {
  return wait_until([&] { return left == 0; }, timeout_s);
}

bool WriteJob::wait_copied(double timeout_s) { return wait_latch(copies_left_, timeout_s); }

bool WriteJob::wait_summed(double timeout_s) { return wait_latch(sums_left_, timeout_s); }

bool WriteJob::wait_written(double timeout_s) {
  return wait_until([this] { return writes_left_ == 0 && sink_ready_; }, timeout_s);
}

void WriteJob::finalize(const std::vector<std::pair<uint64_t, std::string>>& blobs,
                        uint64_t file_size) {
  if (!wait_until([this] { return writes_left_ == 0 && sink_ready_; }, 0.0))
    throw std::logic_error("finalize() before wait_written() returned true");
  if (finalized_) throw std::logic_error("job already finalized");
  PhaseTimer t(timings_.finish);
  sink_->finish(blobs, file_size);
  finalized_ = true;
}

void WriteJob::stamp(std::atomic<int64_t>& at) {
  at.store(std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
               .count(),
           std::memory_order_relaxed);
}

std::vector<std::pair<std::string, double>> WriteJob::timings() const {
  const auto s = [](const std::atomic<uint64_t>& ns) { return ns.load() * 1e-9; };
  const auto at = [](const std::atomic<int64_t>& ns) { return ns.load() < 0 ? -1.0 : ns.load() * 1e-9; };
  return {{"copy", s(timings_.copy)},         {"chunk_wait", s(timings_.chunk_wait)},
          {"crc", s(timings_.crc)},           {"put", s(timings_.put)},
          {"persist", s(timings_.persist)},   {"open", s(timings_.open)},
          {"finish", s(timings_.finish)},     {"copied_at", at(timings_.copied_at)},
          {"written_at", at(timings_.written_at)}};
}

std::vector<uint32_t> WriteJob::record_crcs() const {
  std::vector<uint32_t> out(n_records_, 0);
  for (size_t s = 0; s < spans_.size(); ++s)
    out[spans_[s].record] = crc32_concat(out[spans_[s].record], span_crc_[s], spans_[s].len);
  return out;
}

std::vector<std::tuple<uint32_t, uint64_t, uint64_t, uint32_t>> WriteJob::span_crcs() const {
  std::vector<std::tuple<uint32_t, uint64_t, uint64_t, uint32_t>> out;
  out.reserve(spans_.size());
  for (size_t s = 0; s < spans_.size(); ++s)
    out.emplace_back(spans_[s].record, spans_[s].file_off, spans_[s].len, span_crc_[s]);
  return out;
}

std::vector<std::tuple<uintptr_t, uint64_t, uint64_t>> WriteJob::chunk_layout(size_t c) const {
  std::vector<std::tuple<uintptr_t, uint64_t, uint64_t>> out;
  const uint64_t base = chunk_begin(c);
  for (size_t s = chunk_first_span_.at(c); s < chunk_first_span_.at(c + 1); ++s)
    out.emplace_back(spans_[s].src, spans_[s].file_off - base, spans_[s].len);
  return out;
}

}  // namespace fastckpt
