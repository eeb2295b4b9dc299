// test_crc.cc — CRC-32 against the standard check value, split sums, and the combine step.
#include <doctest/doctest.h>

#include <string>

#include "fastckpt/crc.h"
#include "scratch.h"

using namespace fastckpt;

TEST_CASE("crc32 of the standard check string is 0xCBF43926") {
  const std::string s = "123456789";
  CHECK(crc32_update(0, s.data(), s.size()) == 0xCBF43926u);
  CHECK(crc32_update(0, s.data(), 0) == 0u);
  CHECK_FALSE(crc32_backend_name().empty());
}

TEST_CASE("a sum continued over two parts equals the sum of the whole") {
  auto data = fastckpt_test::pattern(1 << 20, 7);
  const uint32_t whole = crc32_update(0, data.data(), data.size());
  for (size_t cut : {size_t(0), size_t(1), size_t(4095), size_t(1 << 19), data.size()}) {
    uint32_t part = crc32_update(0, data.data(), cut);
    CHECK(crc32_update(part, data.data() + cut, data.size() - cut) == whole);
  }
}

TEST_CASE("crc32_concat joins the sums of adjacent ranges computed apart") {
  auto data = fastckpt_test::pattern(3 * 4096 + 17, 11);
  const uint32_t whole = crc32_update(0, data.data(), data.size());
  for (size_t cut : {size_t(0), size_t(100), size_t(4096), data.size()}) {
    uint32_t a = crc32_update(0, data.data(), cut);
    uint32_t b = crc32_update(0, data.data() + cut, data.size() - cut);
    CHECK(crc32_concat(a, b, data.size() - cut) == whole);
  }
  data[5] ^= 1;  // one flipped bit changes it
  CHECK(crc32_update(0, data.data(), data.size()) != whole);
}
