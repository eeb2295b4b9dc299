// test_memory_maps.cc — the registry of memory-tier mappings (on /dev/shm, where it belongs): a
// file's mapping is found again through a rename and reused by a later take of the same file, a
// deleted file's mapping is dropped, a file cut shorter is mapped afresh, at most kMaxMaps stay
// held, everything unused goes on request, and a forked child inherits no mapping nor descriptor.
// The registry is the process's: counts are deltas.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "fastckpt/file_io.h"
#include "fastckpt/memory_maps.h"
#include "scratch.h"

using namespace fastckpt;
using fastckpt_test::holds_mapped;
using fastckpt_test::holds_open;

namespace {

std::string shm_path(const std::string& name) {
  return "/dev/shm/fastckpt-native-maps-" + std::to_string(::getpid()) + "-" + name;
}

// Takes a mapping of path (created at size bytes), writes `fill` over it, gives it back.
uint8_t* write_through(const std::string& path, uint64_t size, char fill) {
  int fd = open_cut_to(path, O_RDWR, size);
  uint8_t* at = take_memory_map(fd, path, size);
  std::memset(at, fill, size);
  give_back_memory_map(at);
  ::close(fd);
  return at;
}

// Whether this process has path open (any descriptor) or mapped (/proc/self).
bool holds(const std::string& path) { return holds_open(path) || holds_mapped(path); }

}  // namespace

TEST_CASE("a memory file's mapping outlives its writer: found through a rename, reused by the next take") {
  if (::access("/dev/shm", W_OK) != 0) return;
  purge_memory_maps(true);
  const size_t before = held_memory_maps();
  const std::string a = shm_path("a"), b = shm_path("b");
  const uint64_t size = 1 << 20;
  uint8_t* first = write_through(a, size, 'x');
  CHECK(held_memory_maps() == before + 1);
  REQUIRE(std::rename(a.c_str(), b.c_str()) == 0);  // kept aside as a spare, then recycled
  uint8_t* found = find_memory_map(b, size);
  CHECK(found == first);
  CHECK(found[size - 1] == 'x');
  give_back_memory_map(found);
  CHECK(find_memory_map(b, size + 4096) == nullptr);  // longer than the file: not this mapping
  uint8_t* again = write_through(b, size, 'y');
  CHECK(again == first);  // the same mapping, its pages present: no fallocate, no fault
  CHECK(held_memory_maps() == before + 1);
  ::unlink(b.c_str());
  CHECK(find_memory_map(b, size) == nullptr);
  CHECK(held_memory_maps() == before);  // the find purged the deleted file's mapping
}

TEST_CASE("a recycled file cut shorter than the next save is mapped afresh, every byte reserved") {
  if (::access("/dev/shm", W_OK) != 0) return;
  purge_memory_maps(true);
  const std::string p = shm_path("cut");
  write_through(p, 64 << 10, 'a');
  REQUIRE(::truncate(p.c_str(), 8192) == 0);  // its pages beyond 8 KiB are gone
  uint8_t* at = write_through(p, 128 << 10, 'b');
  int fd = ::open(p.c_str(), O_RDONLY);
  std::vector<char> got(128 << 10);
  REQUIRE(::pread(fd, got.data(), got.size(), 0) == static_cast<ssize_t>(got.size()));
  ::close(fd);
  CHECK(at != nullptr);
  CHECK(got.front() == 'b');
  CHECK(got.back() == 'b');
  ::unlink(p.c_str());
  purge_memory_maps(false);
}

TEST_CASE("at most kMaxMaps mappings stay held; everything unused goes on request") {
  if (::access("/dev/shm", W_OK) != 0) return;
  purge_memory_maps(true);
  std::vector<std::string> paths;
  for (size_t i = 0; i < kMaxMaps + 3; ++i) {
    paths.push_back(shm_path("lru" + std::to_string(i)));
    write_through(paths.back(), 4096, 'z');
  }
  CHECK(held_memory_maps() == kMaxMaps);
  CHECK(find_memory_map(paths.front(), 4096) == nullptr);  // the least recently used went first
  uint8_t* last = find_memory_map(paths.back(), 4096);
  CHECK(last != nullptr);
  CHECK(purge_memory_maps(true) == kMaxMaps - 1);  // the one in use stays
  give_back_memory_map(last);
  CHECK(purge_memory_maps(true) == 1);
  CHECK(held_memory_maps() == 0);
  for (const auto& p : paths) ::unlink(p.c_str());
}

TEST_CASE("a full memory filesystem fails the take with ENOSPC naming the file, never a SIGBUS later") {
  if (::access("/dev/shm", W_OK) != 0) return;
  const std::string p = shm_path("huge");
  int fd = open_cut_to(p, O_RDWR, 0);
  try {
    take_memory_map(fd, p, uint64_t(1) << 50);
    FAIL("reserved a petabyte");
  } catch (const IoError& e) {
    CHECK((e.err() == ENOSPC || e.err() == EFBIG || e.err() == EINVAL));
    CHECK(std::string(e.what()).find(p) != std::string::npos);
  }
  ::close(fd);
  ::unlink(p.c_str());
}

TEST_CASE("a forked child (a DataLoader worker) inherits no held mapping nor descriptor, and can take its own") {
  if (::access("/dev/shm", W_OK) != 0) return;
  purge_memory_maps(true);
  const std::string p = shm_path("fork");
  write_through(p, 1 << 20, 'f');
  REQUIRE(held_memory_maps() == 1);
  REQUIRE(holds(p));  // the parent keeps it: mapped, and a descriptor open
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // no doctest macros here: exit codes tell the parent
    if (held_memory_maps() != 0) ::_exit(2);
    if (holds(p)) ::_exit(3);  // it would keep the file's pages allocated after the parent deletes it
    const std::string q = p + "-child";
    write_through(q, 4096, 'c');  // the registry (and its lock) work in the child
    const int held = static_cast<int>(held_memory_maps());
    purge_memory_maps(true);
    ::unlink(q.c_str());
    ::_exit(held == 1 ? 0 : 4);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(held_memory_maps() == 1);  // the parent's is untouched
  uint8_t* at = find_memory_map(p, 1 << 20);
  REQUIRE(at != nullptr);
  CHECK(at[0] == 'f');
  give_back_memory_map(at);
  ::unlink(p.c_str());
  purge_memory_maps(true);
}
