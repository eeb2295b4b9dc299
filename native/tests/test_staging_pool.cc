// test_staging_pool.cc — the bounded pool of aligned host chunks: sizes, acquire with a
// deadline, release, and free_all refusing while a chunk is out,
// and chunks drawn while the pool grows.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "fastckpt/staging_pool.h"

using namespace fastckpt;

TEST_CASE("chunk sizes must be positive multiples of 4096") {
  CHECK_THROWS_AS(StagingPool(0), std::invalid_argument);
  CHECK_THROWS_AS(StagingPool(4097), std::invalid_argument);
  CHECK_NOTHROW(StagingPool(8192));
}

TEST_CASE("grown chunks are aligned, zeroed and all free") {
  StagingPool pool(8192);
  CHECK(pool.capacity() == 0);
  auto addrs = pool.grow(3);
  REQUIRE(addrs.size() == 3);
  for (uintptr_t a : addrs) CHECK(a % kAlign == 0);
  CHECK(pool.capacity() == 3);
  CHECK(pool.free_count() == 3);
  CHECK(pool.addresses() == addrs);
  for (int slot = 0; slot < 3; ++slot)
    for (size_t i = 0; i < pool.chunk_bytes(); i += 512) CHECK(pool.data(slot)[i] == 0);
}

TEST_CASE("acquire gives up at its deadline when every chunk is out, and a release wakes it") {
  StagingPool pool(4096);
  pool.grow(1);
  int slot = pool.acquire(0.0);
  REQUIRE(slot == 0);
  auto t0 = std::chrono::steady_clock::now();
  CHECK(pool.acquire(0.05) == -1);
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(45));
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    pool.release(slot);
  });
  CHECK(pool.acquire(5.0) == 0);  // woken by the release, long before its deadline
  releaser.join();
  pool.release(0);
}

TEST_CASE("free_all refuses while a chunk is in use, and frees once none is") {
  StagingPool pool(4096);
  pool.grow(2);
  int slot = pool.acquire(0.0);
  CHECK_THROWS_AS(pool.free_all(), std::runtime_error);
  CHECK(pool.capacity() == 2);
  pool.release(slot);
  pool.free_all();
  CHECK(pool.capacity() == 0);
  CHECK(pool.acquire(0.0) == -1);
}

TEST_CASE("a chunk is drawn and freed while the pool is still growing") {
  // Each 16 MiB chunk takes milliseconds to fault in; the pool's lock is held only to list it.
  constexpr size_t kChunks = 16;
  StagingPool pool(16 << 20);
  std::vector<uintptr_t> grown;
  std::thread grower([&] { grown = pool.grow(kChunks); });
  const int slot = pool.acquire(30.0);  // woken by the first chunks listed, not by the last
  const size_t capacity_then = pool.capacity();
  const uint8_t* drawn = slot >= 0 ? pool.data(slot) : nullptr;
  if (slot >= 0) pool.release(slot);
  grower.join();
  REQUIRE(slot >= 0);
  CHECK(capacity_then < kChunks);
  CHECK(pool.capacity() == kChunks);
  CHECK(reinterpret_cast<uintptr_t>(drawn) == grown.at(slot));
  CHECK(pool.data(slot) == drawn);  // a chunk's memory stays put as the pool grows past it
}

TEST_CASE("the pool answers while a new chunk is being faulted in") {
  // Faulting in 1 GiB takes far longer than 20 ms; the chunk is listed only once it is made.
  StagingPool pool(size_t{1} << 30);
  std::atomic<bool> started{false};
  std::thread grower([&] {
    started = true;
    pool.grow(1);
  });
  while (!started) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const size_t capacity_meanwhile = pool.capacity();  // not held up by the fault
  grower.join();
  CHECK(capacity_meanwhile == 0);
  CHECK(pool.capacity() == 1);
}
