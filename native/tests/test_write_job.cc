// test_write_job.cc — one file written through the engine's copy/write pipeline: bytes and CRCs
// land where the layout says from every source, held records copy only once released, a bounded
// staging pool is reused, a chunk goes to the writers in slices while they have little to put,
// and failures (a bad path, an abort, a bad layout) surface as errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "fastckpt/crc.h"
#include "fastckpt/engine.h"
#include "fastckpt/file_io.h"
#include "fastckpt/sink.h"
#include "scratch.h"

using namespace fastckpt;
using fastckpt_test::pattern;
using fastckpt_test::read_all;
using fastckpt_test::Scratch;

namespace {

constexpr uint64_t kBegin = 4096;  // data starts after a one-page header

struct Layout {
  std::vector<uint8_t> a = pattern(20000, 1), b = pattern(5000, 2);
  uint64_t data_end = kBegin + 20000 + 5000;
  uint64_t file_size = data_end + 64;
  std::vector<Piece> pieces() const {
    return {{reinterpret_cast<uintptr_t>(a.data()), a.size(), kBegin, 0},
            {reinterpret_cast<uintptr_t>(b.data()), b.size(), kBegin + a.size(), 1}};
  }
};

void finish(WriteJob& job, const Layout& l) {
  REQUIRE(job.wait_copied(10.0));
  REQUIRE(job.wait_written(10.0));
  job.finalize({{0, "HEADER"}, {l.data_end, std::string(64, 'T')}}, l.file_size);
}

void check_file(const std::string& path, const Layout& l, const WriteJob& job) {
  auto got = read_all(path);
  REQUIRE(got.size() == l.file_size);
  CHECK(std::string(got.begin(), got.begin() + 6) == "HEADER");
  CHECK(std::equal(l.a.begin(), l.a.end(), got.begin() + kBegin));
  CHECK(std::equal(l.b.begin(), l.b.end(), got.begin() + kBegin + l.a.size()));
  CHECK(got.back() == 'T');
  auto crcs = job.record_crcs();
  REQUIRE(crcs.size() == 2);
  CHECK(crcs[0] == crc32_update(0, l.a.data(), l.a.size()));
  CHECK(crcs[1] == crc32_update(0, l.b.data(), l.b.size()));
  CHECK(job.bytes_written() == l.a.size() + l.b.size());
}

}  // namespace

TEST_CASE("staged and direct jobs put every byte and CRC where the layout says") {
  Scratch tmp;
  Layout l;
  Engine engine(8192, 2, 2);
  engine.pool().grow(2);
  for (Source source : {Source::Staged, Source::Direct}) {
    for (bool direct_io : {false, true}) {
      CAPTURE(static_cast<int>(source));
      CAPTURE(direct_io);
      const std::string path = tmp.path("f" + std::to_string(static_cast<int>(source)) + std::to_string(direct_io));
      auto job = engine.submit(path, l.pieces(), kBegin, l.data_end, l.file_size, source, direct_io, 2);
      finish(*job, l);
      check_file(path, l, *job);
    }
  }
  CHECK(engine.pool().free_count() == 2);  // every staging chunk given back
  CHECK(engine.progress() > 0);
}

TEST_CASE("a staging pool of one chunk is reused for a file of many chunks") {
  Scratch tmp;
  auto big = pattern(10 * 4096 + 123, 3);
  Engine engine(4096, 2, 2);
  engine.pool().grow(1);
  const uint64_t end = kBegin + big.size();
  auto job = engine.submit(tmp.path("big"), {{reinterpret_cast<uintptr_t>(big.data()), big.size(), kBegin, 0}},
                           kBegin, end, end, Source::Staged, false, 1);
  REQUIRE(job->n_chunks() == 11);
  REQUIRE(job->wait_written(10.0));
  job->finalize({}, end);
  auto got = read_all(tmp.path("big"));
  CHECK(std::equal(big.begin(), big.end(), got.begin() + kBegin));
  CHECK(job->record_crcs()[0] == crc32_update(0, big.data(), big.size()));
}

TEST_CASE("two jobs sharing a pool of two chunks, each copying many, both land with their CRCs") {
  // A chunk is freed once its CRC is done, and a job's CRCs wait until it has copied every chunk: a
  // copy about to wait for a free chunk hands the CRCs held back on (every job's), so a pool smaller
  // than the jobs is reused rather than exhausted.
  Scratch tmp;
  auto one = pattern(12 * 4096 + 7, 4), two = pattern(12 * 4096 + 9, 5);
  Engine engine(4096, 2, 2);
  engine.pool().grow(2);
  const uint64_t end1 = kBegin + one.size(), end2 = kBegin + two.size();
  auto a = engine.submit(tmp.path("a"), {{reinterpret_cast<uintptr_t>(one.data()), one.size(), kBegin, 0}}, kBegin,
                         end1, end1, Source::Staged, false, 1);
  auto b = engine.submit(tmp.path("b"), {{reinterpret_cast<uintptr_t>(two.data()), two.size(), kBegin, 0}}, kBegin,
                         end2, end2, Source::Staged, false, 1);
  REQUIRE(a->wait_written(10.0));
  REQUIRE(b->wait_written(10.0));
  a->finalize({}, end1);
  b->finalize({}, end2);
  CHECK(a->record_crcs()[0] == crc32_update(0, one.data(), one.size()));
  CHECK(b->record_crcs()[0] == crc32_update(0, two.data(), two.size()));
  CHECK(engine.pool().free_count() == 2);
}

TEST_CASE("a held job copies a record only once it is released") {
  Scratch tmp;
  Layout l;
  Engine engine(8192, 2, 2);
  engine.pool().grow(4);
  for (Source source : {Source::Staged, Source::Direct}) {
    CAPTURE(static_cast<int>(source));
    const std::string path = tmp.path("held" + std::to_string(static_cast<int>(source)));
    auto job = engine.submit(path, l.pieces(), kBegin, l.data_end, l.file_size, source, false, 2, true);
    CHECK_FALSE(job->wait_records_copied({0}, 0.05));
    CHECK_FALSE(job->wait_copied(0.0));
    job->release({1});
    CHECK(job->wait_records_copied({1}, 10.0));
    CHECK_FALSE(job->wait_records_copied({0}, 0.05));
    job->release_all();
    finish(*job, l);
    check_file(path, l, *job);
  }
}

TEST_CASE("a file that cannot be created fails the job with the path in the error") {
  Scratch tmp;
  Layout l;
  Engine engine(8192, 1, 1);
  engine.pool().grow(2);
  const std::string path = tmp.path("missing-dir/f");
  auto job = engine.submit(path, l.pieces(), kBegin, l.data_end, l.file_size, Source::Staged, false, 2);
  bool threw = false;
  try {
    job->wait_written(10.0);
  } catch (const IoError& e) {
    threw = true;
    CHECK(std::string(e.what()).find(path) != std::string::npos);
    CHECK(e.err() == ENOENT);
  }
  CHECK(threw);
}

TEST_CASE("an aborted job reports the abort to every waiter and leaves no task running") {
  Scratch tmp;
  Layout l;
  Engine engine(8192, 1, 1);
  engine.pool().grow(2);
  auto job = engine.submit(tmp.path("aborted"), l.pieces(), kBegin, l.data_end, l.file_size, Source::Staged, false,
                           2, true);
  CHECK(job->abort("stopped by the test", 10.0));
  CHECK_THROWS_WITH_AS(job->wait_copied(1.0), doctest::Contains("stopped by the test"), std::runtime_error);
  CHECK_THROWS_AS(job->wait_written(1.0), std::runtime_error);
  CHECK(engine.pool().free_count() == 2);
}

TEST_CASE("a layout that overlaps, overflows or starts unaligned is refused") {
  Scratch tmp;
  Layout l;
  Engine engine(8192, 1, 1);
  auto overlapping = l.pieces();
  overlapping[1].file_off -= 1;
  CHECK_THROWS_AS(engine.submit(tmp.path("x"), overlapping, kBegin, l.data_end, l.file_size, Source::Staged, false, 2),
                  std::invalid_argument);
  CHECK_THROWS_AS(engine.submit(tmp.path("x"), l.pieces(), kBegin, l.data_end - 1, l.file_size, Source::Staged, false, 2),
                  std::invalid_argument);
  CHECK_THROWS_AS(engine.submit(tmp.path("x"), l.pieces(), kBegin, l.data_end, l.data_end - 1, Source::Staged, false, 2),
                  std::invalid_argument);
  CHECK_THROWS_AS(engine.submit(tmp.path("x"), l.pieces(), kBegin, l.data_end, l.file_size, Source::Staged, false, 1),
                  std::invalid_argument);  // record 1 of 1
  std::vector<Piece> unaligned{{reinterpret_cast<uintptr_t>(l.a.data()), 100, 100, 0}};
  CHECK_THROWS_AS(engine.submit(tmp.path("x"), unaligned, 100, 200, 200, Source::Staged, false, 1),
                  std::invalid_argument);
}

namespace {

// A sink in plain memory that records which threads put and persisted: the job must treat any
// Sink alike, putting on the threads the sink asks for and persisting every byte it put.
class MemorySink final : public Sink {
 public:
  MemorySink(uint64_t size, bool on_copy_thread, bool with_put, bool cpu_copy = false)
      : bytes(size, 0), on_copy_thread_(on_copy_thread), with_put_(with_put), cpu_copy_(cpu_copy) {}
  void check_extent(uint64_t, uint64_t end, uint64_t) const override {
    if (end > bytes.size()) throw std::invalid_argument("past the end");
  }
  bool needs_open() const override { return false; }
  void put(const void* src, uint64_t len, uint64_t off, bool) override {
    std::memcpy(bytes.data() + off, src, len);
    put_bytes += len;
    std::lock_guard<std::mutex> lk(puts_mu);
    puts.emplace_back(off, len);
  }
  bool put_on_copy_thread() const override { return on_copy_thread_; }
  bool put_is_cpu_copy() const override { return cpu_copy_; }
  void persist(uint64_t, uint64_t len) override { persisted += len; }
  bool persist_with_put() const override { return with_put_; }
  void finish(const std::vector<std::pair<uint64_t, std::string>>& blobs, uint64_t) override {
    for (const auto& [off, blob] : blobs) std::memcpy(bytes.data() + off, blob.data(), blob.size());
    finished = true;
  }
  std::vector<uint8_t> bytes;
  std::atomic<uint64_t> put_bytes{0}, persisted{0};
  std::mutex puts_mu;
  std::vector<std::pair<uint64_t, uint64_t>> puts;  // (offset, length) of every put, in order
  bool finished = false;

 private:
  bool on_copy_thread_, with_put_, cpu_copy_;
};

}  // namespace

TEST_CASE("every source puts every byte into any sink, persisted, on the threads the sink asks for") {
  Layout l;
  StagingPool pool(8192);
  pool.grow(2);
  ThreadPool copiers(2), writers(2), summers(2);
  std::atomic<uint64_t> progress{0};
  for (Source source : {Source::Staged, Source::Direct}) {
    for (bool on_copy_thread : {false, true}) {
      for (bool with_put : {false, true}) {
        CAPTURE(static_cast<int>(source));
        CAPTURE(on_copy_thread);
        CAPTURE(with_put);
        auto sink = std::make_unique<MemorySink>(l.file_size, on_copy_thread, with_put);
        MemorySink& mem = *sink;
        auto job = std::make_shared<WriteJob>(Workers{&pool, &copiers, &writers, &summers, &progress}, std::move(sink),
                                              l.pieces(), kBegin, l.data_end, l.file_size, source, 4096, 2);
        job->start();
        REQUIRE(job->wait_copied(10.0));
        REQUIRE(job->wait_written(10.0));
        job->finalize({{0, "HEADER"}}, l.file_size);
        CHECK(mem.finished);
        CHECK(std::string(mem.bytes.begin(), mem.bytes.begin() + 6) == "HEADER");
        CHECK(std::equal(l.a.begin(), l.a.end(), mem.bytes.begin() + kBegin));
        CHECK(std::equal(l.b.begin(), l.b.end(), mem.bytes.begin() + kBegin + l.a.size()));
        CHECK(mem.persisted.load() == mem.put_bytes.load());  // whatever was put was persisted
        CHECK(job->bytes_written() == l.a.size() + l.b.size());
        CHECK(job->record_crcs()[1] == crc32_update(0, l.b.data(), l.b.size()));
      }
    }
  }
  CHECK(pool.free_count() == 2);
}

namespace {

// Holds a one-thread pool's thread from construction until release() (or destruction): a task
// queued on it first blocks there, so every task queued after it waits.
class ThreadHold {
 public:
  explicit ThreadHold(ThreadPool& pool) : held_(mu_) {
    pool.submit([this] {
      waiting_ = true;
      { std::lock_guard<std::mutex> lk(mu_); }
      done_ = true;
    });
    while (!waiting_) std::this_thread::yield();
  }
  ~ThreadHold() {
    release();
    while (!done_) std::this_thread::yield();  // the holding task is done with mu_
  }
  ThreadHold(const ThreadHold&) = delete;
  ThreadHold& operator=(const ThreadHold&) = delete;
  void release() {
    if (held_.owns_lock()) held_.unlock();
  }

 private:
  std::mutex mu_;
  std::unique_lock<std::mutex> held_;
  std::atomic<bool> waiting_{false}, done_{false};
};

// A job of one record (`bytes`, at kBegin) into a MemorySink whose put is a CPU copy or not, on
// one writer and one CRC thread, one of the two held from the start (the holding task is queued
// before any of the job's) until release(). Staged on one 4 KiB slot with one copy thread unless
// its Shape says otherwise.
enum class Held { Crc, Writer };

struct Shape {
  uint64_t chunk = 4096;
  size_t slots = 1;
  size_t copy_threads = 1;
  Source source = Source::Staged;
};

class HeldJob {
 public:
  HeldJob(const std::vector<uint8_t>& bytes, bool cpu_copy, Held held, Shape shape = {})
      : pool(shape.chunk), copiers(shape.copy_threads), end(kBegin + bytes.size()),
        hold_(held == Held::Crc ? summers : writers) {
    pool.grow(shape.slots);
    auto sink = std::make_unique<MemorySink>(end, false, false, cpu_copy);
    mem = sink.get();
    job = std::make_shared<WriteJob>(Workers{&pool, &copiers, &writers, &summers, &progress}, std::move(sink),
                                     std::vector<Piece>{{reinterpret_cast<uintptr_t>(bytes.data()), bytes.size(),
                                                         kBegin, 0}},
                                     kBegin, end, end, shape.source, 4096, 1);
    job->start();
  }
  void release() { hold_.release(); }
  // Waits up to 10 s for `n` bytes to be put; the bytes put by then.
  uint64_t put_bytes_within(uint64_t n, int tries = 1000) const {
    for (int i = 0; i < tries && mem->put_bytes.load() < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return mem->put_bytes.load();
  }

  StagingPool pool;
  ThreadPool copiers, writers{1}, summers{1};
  std::atomic<uint64_t> progress{0};
  const uint64_t end;
  MemorySink* mem = nullptr;
  std::shared_ptr<WriteJob> job;

 private:
  ThreadHold hold_;  // made before the constructor's body queues any of the job's tasks
};

}  // namespace

TEST_CASE("a staged chunk is put while its CRC is still being summed, and its slot waits for both") {
  // The CRC threads are held: every put must still land (the disk never waits for a CRC), while the
  // only staging slot stays taken, so the second chunk is not copied over bytes still being summed.
  auto big = pattern(2 * 4096, 5);
  HeldJob h(big, false, Held::Crc);
  CHECK(h.put_bytes_within(4096) == 4096);         // chunk 0 put...
  CHECK(std::get<3>(h.job->span_crcs()[0]) == 0);  // ...before its CRC was summed (the sum is held)
  CHECK_FALSE(h.job->wait_copied(0.2));            // chunk 1 not copied: the slot waits for chunk 0's CRC
  CHECK(h.pool.free_count() == 0);
  h.release();
  REQUIRE(h.job->wait_written(10.0));
  h.job->finalize({}, kBegin + big.size());
  CHECK(std::equal(big.begin(), big.end(), h.mem->bytes.begin() + kBegin));
  CHECK(h.job->record_crcs()[0] == crc32_update(0, big.data(), big.size()));
  CHECK(h.pool.free_count() == 1);
}

TEST_CASE("a staged chunk is put by a writer where the device copies it, by a CRC thread where the CPU does") {
  // The CRC threads are held. A put the device makes (O_DIRECT) lands on a writer, which is never
  // niced, so a busy CPU cannot leave the disk idle; a put that is a CPU copy (through the page
  // cache) waits for the lower-priority CRC threads, off the gate.
  for (bool cpu_copy : {false, true}) {
    CAPTURE(cpu_copy);
    auto data = pattern(4096, 11);
    HeldJob h(data, cpu_copy, Held::Crc);
    REQUIRE(h.job->wait_copied(10.0));
    CHECK(h.put_bytes_within(4096, 50) == (cpu_copy ? 0u : 4096u));
    h.release();
    REQUIRE(h.job->wait_written(10.0));
    h.job->finalize({}, kBegin + data.size());
    CHECK(std::equal(data.begin(), data.end(), h.mem->bytes.begin() + kBegin));
  }
}

TEST_CASE("a staged chunk is put in slices as it is copied while the writers have little to put, else whole") {
  // One copy thread, one writer held from the start: chunk 0 is copied while nothing waits to be
  // put, so it goes in slices of an eighth (the disk would otherwise wait for its whole copy);
  // chunk 1 is copied once chunk 0's slices wait, a chunk's worth, so it goes whole. A put that is
  // a CPU copy goes whole either way.
  constexpr uint64_t kChunk = 64 << 10, kSlice = kChunk / 8;
  for (bool cpu_copy : {false, true}) {
    CAPTURE(cpu_copy);
    auto data = pattern(2 * kChunk - 1000, 13);  // chunk 1 ends short of a page
    HeldJob h(data, cpu_copy, Held::Writer, {kChunk, 2, 1});
    REQUIRE(h.job->wait_copied(10.0));  // both chunks copied while the writer is still held
    h.release();
    REQUIRE(h.job->wait_written(10.0));
    h.job->finalize({}, h.end);
    std::vector<std::pair<uint64_t, uint64_t>> want;
    if (cpu_copy) {
      want = {{kBegin, kChunk}, {kBegin + kChunk, data.size() - kChunk}};
    } else {
      for (uint64_t lo = 0; lo < kChunk; lo += kSlice) want.emplace_back(kBegin + lo, kSlice);
      want.emplace_back(kBegin + kChunk, data.size() - kChunk);
    }
    std::lock_guard<std::mutex> lk(h.mem->puts_mu);
    std::sort(h.mem->puts.begin(), h.mem->puts.end());
    CHECK(h.mem->puts == want);
    CHECK(std::equal(data.begin(), data.end(), h.mem->bytes.begin() + kBegin));
    CHECK(h.job->record_crcs()[0] == crc32_update(0, data.data(), data.size()));
    CHECK(h.job->bytes_written() == data.size());
    CHECK(h.pool.free_count() == 2);
  }
}

TEST_CASE("every CRC of a staged job is known while its writers still hold the last bytes") {
  // The writer is held: nothing is written, yet "summed" falls and record_crcs() is right, so the
  // caller builds the file's headers while the disk is still busy; "written" falls only after.
  constexpr uint64_t kChunk = 64 << 10;
  auto data = pattern(3 * kChunk - 1000, 17);
  HeldJob h(data, false, Held::Writer, {kChunk, 3, 2});
  REQUIRE(h.job->wait_summed(10.0));
  CHECK_FALSE(h.job->wait_written(0.0));
  CHECK(h.mem->put_bytes.load() == 0);
  CHECK(h.job->record_crcs()[0] == crc32_update(0, data.data(), data.size()));
  h.release();
  REQUIRE(h.job->wait_written(10.0));
  h.job->finalize({}, h.end);
  CHECK(std::equal(data.begin(), data.end(), h.mem->bytes.begin() + kBegin));
}

TEST_CASE("every CRC of a direct job is known once each span is summed") {
  // A direct span is summed on its writer before its put: the CRC threads (held) have no part in it.
  auto data = pattern(5 * 4096 + 123, 19);
  HeldJob h(data, false, Held::Crc, {4096, 0, 1, Source::Direct});
  REQUIRE(h.job->wait_summed(10.0));
  CHECK(h.job->record_crcs()[0] == crc32_update(0, data.data(), data.size()));
  REQUIRE(h.job->wait_written(10.0));
  h.job->finalize({}, h.end);
  CHECK(std::equal(data.begin(), data.end(), h.mem->bytes.begin() + kBegin));
}
