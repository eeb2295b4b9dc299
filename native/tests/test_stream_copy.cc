// test_stream_copy.cc — a streaming copy writes exactly the source's bytes, at every alignment of
// either side and every length around the 16-byte head and the 64-byte blocks, and nothing
// outside its range.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fastckpt/stream_copy.h"

using namespace fastckpt;
using std::size_t;

TEST_CASE("a streaming copy writes the source's bytes at every alignment and length, and nothing around them") {
  std::vector<uint8_t> src(4096 + 64), dst(4096 + 256);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t dst_at : {0, 1, 7, 15, 16, 33, 63}) {
    for (size_t src_at : {0, 3, 16}) {
      for (size_t n : {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 200, 1000, 4096}) {
        std::fill(dst.begin(), dst.end(), uint8_t{0xEE});
        copy_streaming(dst.data() + dst_at, src.data() + src_at, n);
        bool same = true;
        for (size_t i = 0; i < n; ++i) same = same && dst[dst_at + i] == src[src_at + i];
        bool untouched = true;
        for (size_t i = 0; i < dst.size(); ++i)
          if (i < dst_at || i >= dst_at + n) untouched = untouched && dst[i] == 0xEE;
        INFO("dst_at=" << dst_at << " src_at=" << src_at << " n=" << n);
        CHECK(same);
        CHECK(untouched);
      }
    }
  }
}

TEST_CASE("a staging copy of a large span streams: kStreamFrom is a whole number of blocks") {
  CHECK(kStreamFrom % 64 == 0);
  std::vector<uint8_t> src(kStreamFrom + 80), dst(kStreamFrom + 80);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i ^ (i >> 8));
  copy_streaming(dst.data() + 5, src.data() + 9, kStreamFrom + 40);
  CHECK(std::equal(src.begin() + 9, src.begin() + 9 + kStreamFrom + 40, dst.begin() + 5));
}
