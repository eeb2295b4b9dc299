// test_io_memory.cc — the memory O_DIRECT moves: aligned to a huge page from one huge page up,
// zeroed, present, advised for huge pages before the first touch, unmapped when dropped or
// moved from.
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <utility>

#include "fastckpt/io_memory.h"

using namespace fastckpt;

namespace {

// The VmFlags line of the mapping that holds addr, from /proc/self/smaps ("" if none holds it).
std::string vm_flags_of(const void* addr) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  const auto a = reinterpret_cast<uintptr_t>(addr);
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {  // a mapping's first line
      inside = lo <= a && a < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

}  // namespace

TEST_CASE("from one huge page up, io memory is aligned to a huge page, zeroed and advised for huge pages") {
  IoMemory m(3 * kHugePage + 4096);
  REQUIRE(m.data() != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(m.data()) % kHugePage == 0);
  CHECK(m.size() == 3 * kHugePage + 4096);
  for (size_t i = 0; i < m.size(); i += 512) CHECK(m.data()[i] == 0);
  m.data()[m.size() - 1] = 7;  // every byte is writable
#ifdef __linux__
  CHECK(vm_flags_of(m.data()).find(" hg") != std::string::npos);
#endif
}

TEST_CASE("below one huge page, io memory is page-aligned, zeroed and not advised") {
  IoMemory m(5000);
  CHECK(reinterpret_cast<uintptr_t>(m.data()) % 4096 == 0);
  CHECK(m.size() == 8192);
  for (size_t i = 0; i < m.size(); ++i) CHECK(m.data()[i] == 0);
#ifdef __linux__
  CHECK(vm_flags_of(m.data()).find(" hg") == std::string::npos);
#endif
}

TEST_CASE("io memory is unmapped when dropped, and a move hands the mapping over") {
  uint8_t* at = nullptr;
  {
    IoMemory a(kHugePage);
    at = a.data();
    IoMemory b(std::move(a));
    CHECK(a.data() == nullptr);
    CHECK(b.data() == at);
    CHECK(!vm_flags_of(at).empty());
  }
  CHECK(vm_flags_of(at).empty());  // no mapping holds it any more
}
