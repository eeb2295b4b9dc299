// test_pmem_pool.cc — a pool file mapped once: 8-byte switches persist and survive a reopen,
// a mapped write job stores its spans at offset + shift under each persistence path, and
// stores outside the pool are refused.
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>

#include "fastckpt/crc.h"
#include "fastckpt/engine.h"
#include "fastckpt/file_io.h"
#include "fastckpt/pmem_pool.h"
#include "scratch.h"

using namespace fastckpt;
using fastckpt_test::pattern;
using fastckpt_test::Scratch;

TEST_CASE("store8 persists and a reopened pool reads it back") {
  Scratch tmp;
  const std::string path = tmp.path("pool");
  {
    PmemPool pool(path, 1 << 20, true, 1);
    CHECK(pool.size() == (1u << 20));
    CHECK(pool.mode() == Persist::Msync);
    pool.store8(4096, 0x1122334455667788ull);
    CHECK(pool.load8(4096) == 0x1122334455667788ull);
    CHECK_THROWS_AS(pool.store8(4097, 1), std::invalid_argument);
    CHECK_THROWS(pool.store8(1 << 20, 1));  // past the end
  }
  PmemPool again(path, 0, false, 1);
  CHECK(again.size() == (1u << 20));
  CHECK(again.load8(4096) == 0x1122334455667788ull);
}

TEST_CASE("a mapped job stores each span at its offset plus the shift, under every persistence path") {
  Scratch tmp;
  auto a = pattern(9000, 5), b = pattern(300, 6);
  for (int force : {-1, 0, 1}) {  // chosen (libpmem2 where built with it), fence, msync
    CAPTURE(force);
    auto pool = std::make_shared<PmemPool>(tmp.path("pool" + std::to_string(force)), 1 << 20, true, force);
    Engine engine(8192, 2, 2);
    const uint64_t shift = 65536;
    std::vector<Piece> pieces{{reinterpret_cast<uintptr_t>(a.data()), a.size(), 0, 0},
                              {reinterpret_cast<uintptr_t>(b.data()), b.size(), a.size(), 1}};
    auto job = engine.submit_mapped(pool, shift, pieces, 0, a.size() + b.size(), 2, false);
    REQUIRE(job->wait_copied(10.0));
    REQUIRE(job->wait_written(10.0));
    CHECK(std::equal(a.begin(), a.end(), pool->base() + shift));
    CHECK(std::equal(b.begin(), b.end(), pool->base() + shift + a.size()));
    CHECK(job->record_crcs()[1] == crc32_update(0, b.data(), b.size()));
    CHECK_THROWS_AS(job->finalize({}, 0), std::logic_error);  // a pool has no file to finalize
  }
}

TEST_CASE("a mapped job whose extent falls outside the pool is refused before any store") {
  Scratch tmp;
  auto pool = std::make_shared<PmemPool>(tmp.path("pool"), 1 << 16, true, 1);
  auto a = pattern(4096, 9);
  Engine engine(8192, 1, 1);
  std::vector<Piece> pieces{{reinterpret_cast<uintptr_t>(a.data()), a.size(), 0, 0}};
  CHECK_THROWS_AS(engine.submit_mapped(pool, (1 << 16) - 100, pieces, 0, a.size(), 1, false), std::invalid_argument);
  CHECK(pool->load8(0) == 0);
}

TEST_CASE("an empty or missing pool file is a clear error") {
  Scratch tmp;
  CHECK_THROWS_AS(PmemPool(tmp.path("absent"), 0, false, 1), IoError);
  { std::ofstream(tmp.path("empty")); }
  CHECK_THROWS_WITH(PmemPool(tmp.path("empty"), 0, false, 1), doctest::Contains("is empty"));
}
