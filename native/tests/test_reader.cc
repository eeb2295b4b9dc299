// test_reader.cc — reading file ranges into caller memory: every byte and every range's CRC-32
// the same whether a part is read through the page cache or, cold, around it (O_DIRECT into a
// bounce buffer: the file's pages stay out of the cache), and a file shorter than a range fails.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "fastckpt/crc.h"
#include "fastckpt/file_io.h"
#include "fastckpt/reader.h"
#include "scratch.h"

using namespace fastckpt;
using namespace fastckpt_test;

namespace {

// Writes bytes to path, makes them durable and drops the file's pages from the cache.
void write_cold(const std::string& path, const std::vector<uint8_t>& bytes) {
  int fd = open_or_throw(path, O_WRONLY | O_CREAT | O_TRUNC);
  pwrite_full(fd, bytes.data(), bytes.size(), 0, path);
  fdatasync_or_throw(fd, path);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// How many of the file's pages are in the page cache.
size_t cached_pages(const std::string& path) {
  int fd = open_or_throw(path, O_RDONLY);
  const off_t size = ::lseek(fd, 0, SEEK_END);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  const size_t page = ::sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> in((size + page - 1) / page);
  ::mincore(map, size, in.data());
  ::munmap(map, size);
  ::close(fd);
  size_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return n;
}

// Reads the whole file through the page cache: every page of it cached.
void cache_whole(const std::string& path, size_t size) {
  std::vector<uint8_t> all(size);
  int fd = open_or_throw(path, O_RDONLY);
  pread_full(fd, all.data(), all.size(), 0, path);
  ::close(fd);
}

bool takes_o_direct(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd >= 0) ::close(fd);
  return fd >= 0;
}

}  // namespace

TEST_CASE("ranges read cold and warm give the same bytes and CRCs; a cold large part leaves the cache alone") {
  Scratch dir;
  const std::string path = dir.path("ranges.bin");
  const size_t mib = size_t{1} << 20;
  const std::vector<uint8_t> bytes = pattern(40 * mib + 3000, 7);
  write_cold(path, bytes);
  // a large aligned range (split in parts, one shorter than the bounce), an unaligned one, a
  // small one, an empty one, and one running to the file's unaligned end
  const std::vector<std::pair<uint64_t, uint64_t>> spans = {
      {0, 21 * mib + 4096}, {21 * mib + 4096 + 100, 5 * mib}, {27 * mib, 8192}, {28 * mib, 0},
      {32 * mib, 8 * mib + 3000}};
  for (int round = 0; round < 2; ++round) {  // round 0 cold, round 1 with the pages cached
    std::vector<std::vector<uint8_t>> dst;
    std::vector<ReadRange> ranges;
    for (auto [off, len] : spans) {
      dst.emplace_back(len + 1, uint8_t{0xAB});  // one byte past the range: never written
      ranges.push_back({reinterpret_cast<uintptr_t>(dst.back().data()), off, len});
    }
    const std::vector<uint32_t> crcs = read_ranges(path, ranges, 3, 6 * mib, true);
    REQUIRE(crcs.size() == spans.size());
    for (size_t i = 0; i < spans.size(); ++i) {
      auto [off, len] = spans[i];
      INFO("round " << round << " range " << i);
      CHECK(std::equal(bytes.begin() + off, bytes.begin() + off + len, dst[i].begin()));
      CHECK(dst[i][len] == 0xAB);
      CHECK(crcs[i] == crc32_update(0, bytes.data() + off, len));
    }
    if (round == 0) cache_whole(path, bytes.size());  // round 1: every part goes through the cache
  }
}

TEST_CASE("a cold file read in large aligned parts leaves its pages out of the page cache") {
  Scratch dir;
  const std::string path = dir.path("cold.bin");
  const size_t mib = size_t{1} << 20;
  // parts of 16 MiB and 8 MiB + 3000, the last running to the file's unaligned end (its direct read comes back
  // short there, inside the last 4 KiB block)
  const std::vector<uint8_t> bytes = pattern(24 * mib + 3000, 11);
  write_cold(path, bytes);
  if (!takes_o_direct(path)) return;  // a filesystem without O_DIRECT: every read goes through the cache
  std::vector<uint8_t> dst(bytes.size());
  const auto crcs =
      read_ranges(path, {{reinterpret_cast<uintptr_t>(dst.data()), 0, bytes.size()}}, 3, 16 * mib, true);
  CHECK(dst == bytes);
  CHECK(crcs[0] == crc32_update(0, bytes.data(), bytes.size()));
  CHECK(cached_pages(path) < mib / 4096);  // read through the cache, all 6145 pages would be there
}

TEST_CASE("a file that ends before a range does fails the read, cold or warm") {
  Scratch dir;
  const std::string path = dir.path("short.bin");
  const size_t mib = size_t{1} << 20;
  write_cold(path, pattern(6 * mib, 3));
  std::vector<uint8_t> dst(8 * mib);
  CHECK_THROWS_AS(read_ranges(path, {{reinterpret_cast<uintptr_t>(dst.data()), 0, 8 * mib}}, 2, 64 * mib, true),
                  IoError);
  cache_whole(path, 6 * mib);
  CHECK_THROWS_AS(read_ranges(path, {{reinterpret_cast<uintptr_t>(dst.data()), 0, 8 * mib}}, 2, 64 * mib, true),
                  IoError);
}
