// test_file_sink.cc — the file sink alone: blocks land at their offsets, O_DIRECT carries
// aligned blocks where the filesystem takes it and buffered writes carry the rest, finish()
// writes the headers, sets the final size and closes, and a bad path fails with the path named.
#include <doctest/doctest.h>

#include <stdlib.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "fastckpt/file_io.h"
#include "fastckpt/file_sink.h"
#include "scratch.h"

using namespace fastckpt;
using fastckpt_test::pattern;
using fastckpt_test::read_all;
using fastckpt_test::Scratch;

namespace {

// A 4096-aligned copy of bytes (what O_DIRECT needs of a buffer).
struct Aligned {
  explicit Aligned(const std::vector<uint8_t>& bytes) : n(bytes.size()) {
    REQUIRE(posix_memalign(&p, kAlign, round_up(n, kAlign)) == 0);
    std::memset(p, 0, round_up(n, kAlign));
    std::memcpy(p, bytes.data(), n);
  }
  ~Aligned() { free(p); }
  void* p = nullptr;
  size_t n;
};

}  // namespace

TEST_CASE("blocks land at their offsets, headers and the final size come last") {
  Scratch dir;
  const std::string path = dir.path("f.bin");
  const auto a = pattern(8192, 3), b = pattern(1000, 4);
  Aligned block(a);
  for (bool direct : {false, true}) {
    FileSink file(path, 4096 + 8192 + 1000 + 16, direct);
    file.open();
    REQUIRE(file.is_open());
    const bool carried = file.write_block(block.p, a.size(), 4096, true);
    CHECK(carried == file.used_direct_io());
    if (direct) CHECK(carried != file.direct_io_refused());  // carried, or refused and said so
    if (!direct) CHECK_FALSE(carried);
    if (!direct) CHECK_FALSE(file.direct_io_refused());  // not asked for: nothing was refused
    CHECK_FALSE(file.write_block(b.data(), b.size(), 4096 + 8192, false));  // unaligned: buffered
    file.finish({{0, "HEAD"}, {4096 + 8192 + 1000, std::string(16, 'T')}}, 4096 + 8192 + 1000 + 16);
    CHECK_FALSE(file.is_open());
    const auto got = read_all(path);
    REQUIRE(got.size() == 4096 + 8192 + 1000 + 16);
    CHECK(std::memcmp(got.data(), "HEAD", 4) == 0);
    CHECK(std::memcmp(got.data() + 4096, a.data(), a.size()) == 0);
    CHECK(std::memcmp(got.data() + 4096 + 8192, b.data(), b.size()) == 0);
    CHECK(got.back() == 'T');
  }
}

TEST_CASE("a path that cannot be created fails open() naming it") {
  Scratch dir;
  FileSink file(dir.path("no/such/dir/f.bin"), 4096, false);
  try {
    file.open();
    FAIL("open() succeeded");
  } catch (const std::exception& e) {
    CHECK(std::string(e.what()).find("no/such/dir/f.bin") != std::string::npos);
  }
  CHECK_THROWS_AS(file.finish({}, 0), std::logic_error);
}
