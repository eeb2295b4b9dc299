// test_memory_file_sink.cc — the memory file sink alone (on /dev/shm, where it belongs): blocks
// land at their offsets through the mapping, headers and the final size come last, a longer file
// already there (a recycled part) is cut and every byte up to the new size is the new one's, and
// a bad path fails with the path named, and a process forked while it is written holds no
// descriptor of it.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "fastckpt/file_io.h"
#include "fastckpt/memory_file_sink.h"
#include "scratch.h"

using namespace fastckpt;
using fastckpt_test::pattern;
using fastckpt_test::read_all;

TEST_CASE("a memory file: blocks through the mapping, over a longer recycled file, cut to its size") {
  if (::access("/dev/shm", W_OK) != 0) return;  // no memory filesystem here
  const std::string path = "/dev/shm/fastckpt-native-memsink-" + std::to_string(::getpid());
  CHECK(on_memory_filesystem("/dev/shm"));
  {
    std::ofstream old(path, std::ios::binary);  // a recycled part: longer, every byte 0xA5
    const std::string fill(3 * 8192, '\xA5');
    old.write(fill.data(), static_cast<std::streamsize>(fill.size()));
  }
  const auto a = pattern(8192, 3), b = pattern(1000, 4);
  const uint64_t size = 4096 + 8192 + 1000 + 16;
  MemoryFileSink file(path, size);
  CHECK(file.put_on_copy_thread());
  CHECK_THROWS_AS(file.check_extent(0, size + 1, size), std::invalid_argument);
  file.open();
  file.put(a.data(), a.size(), 4096, false);
  file.put(b.data(), b.size(), 4096 + 8192, false);
  file.put(std::string(4096, '\0').data(), 4096, 0, false);  // what the job's padding writes
  file.finish({{0, "HEAD"}, {4096 + 8192 + 1000, std::string(16, 'T')}}, size);
  const auto got = read_all(path);
  ::unlink(path.c_str());
  REQUIRE(got.size() == size);
  CHECK(std::memcmp(got.data(), "HEAD", 4) == 0);
  CHECK(std::memcmp(got.data() + 4096, a.data(), a.size()) == 0);
  CHECK(std::memcmp(got.data() + 4096 + 8192, b.data(), b.size()) == 0);
  CHECK(got.back() == 'T');
}

TEST_CASE("a memory file in a missing folder fails naming the path") {
  MemoryFileSink file("/dev/shm/fastckpt-no-such-folder/x", 4096);
  try {
    file.open();
    FAIL("opened a file in a missing folder");
  } catch (const IoError& e) {
    CHECK(std::string(e.what()).find("fastckpt-no-such-folder") != std::string::npos);
  }
}

TEST_CASE("a disk is not a memory filesystem") {
  CHECK_FALSE(on_memory_filesystem("/proc/self/no-such-path"));
}

TEST_CASE("a process forked while a memory file is written holds no descriptor of it") {
  if (::access("/dev/shm", W_OK) != 0) return;
  const std::string path = "/dev/shm/fastckpt-native-memsink-fork-" + std::to_string(::getpid());
  MemoryFileSink file(path, 8192);
  file.open();
  file.put(std::string(8192, 'x').data(), 8192, 0, false);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // a DataLoader worker forked mid-save: it must not pin the file once deleted
    ::_exit(fastckpt_test::holds_open(path) ? 3 : 0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  file.finish({}, 8192);
  const auto got = read_all(path);
  ::unlink(path.c_str());
  REQUIRE(got.size() == 8192);
  CHECK(got.front() == 'x');
}
