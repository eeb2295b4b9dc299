// io_memory.cc — the definitions of io_memory.h: map, align, advise, touch; unmap.
#include "fastckpt/io_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <new>
#include <utility>

#include "fastckpt/file_io.h"  // kAlign

namespace fastckpt {

namespace {

size_t round_up_to(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

IoMemory::IoMemory(size_t n) : size_(round_up_to(n == 0 ? 1 : n, kAlign)) {
  // Below one huge page there is nothing to align: a plain mapping.
  const bool huge = size_ >= kHugePage;
  const size_t slack = huge ? kHugePage : 0;
  void* p = ::mmap(nullptr, size_ + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  auto* base = static_cast<uint8_t*>(p);
  auto* start = reinterpret_cast<uint8_t*>(round_up_to(reinterpret_cast<uintptr_t>(base), huge ? kHugePage : kAlign));
  // Give back the slack on both sides of the aligned range (page-aligned, so munmap takes it).
  if (start > base) ::munmap(base, static_cast<size_t>(start - base));
  if (uint8_t* end = start + size_; end < base + size_ + slack) ::munmap(end, static_cast<size_t>(base + size_ + slack - end));
#ifdef MADV_HUGEPAGE
  if (huge) ::madvise(start, size_, MADV_HUGEPAGE);  // before the first touch, or the pages are small
#endif
  for (size_t i = 0; i < size_; i += kAlign) start[i] = 0;  // fault in now, not in the first snapshot
  data_ = start;
}

IoMemory::~IoMemory() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

IoMemory::IoMemory(IoMemory&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

IoMemory& IoMemory::operator=(IoMemory&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace fastckpt
