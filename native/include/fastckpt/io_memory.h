// io_memory.h — host memory that O_DIRECT writes from and reads into (the staging chunks, the
// direct path's bounce buffer): a private anonymous mapping, aligned to 2 MiB and advised for
// transparent huge pages before its first touch, every page faulted in (zeroed) at allocation.
//
// Why huge pages: the block layer builds a request from the physically contiguous runs of the
// user memory it moves, at most max_segments of them; with scattered 4 KiB pages that caps a
// request near 0.5-1 MiB, with 2 MiB pages it reaches max_sectors_kb (4 MiB on a virtio disk).
// Where a disk pays per request, that is the write's speed: on this project's virtio disk a
// 1 GiB O_DIRECT write took 0.50 s from huge pages and 0.80-0.84 s from 4 KiB pages (260 against
// about 2000 requests). Where huge pages are off or none is free, the advice is ignored and the
// memory is ordinary pages; nothing else changes.
// Definitions: src/io_memory.cc.
#pragma once
#include <cstddef>
#include <cstdint>

namespace fastckpt {

// The alignment, and the size from which the advice is given: one huge page.
constexpr size_t kHugePage = size_t{2} << 20;

class IoMemory {
 public:
  // n bytes (rounded up to whole 4 KiB pages), zeroed and present; throws std::bad_alloc.
  explicit IoMemory(size_t n);
  ~IoMemory();
  IoMemory(IoMemory&& other) noexcept;
  IoMemory& operator=(IoMemory&& other) noexcept;
  IoMemory(const IoMemory&) = delete;
  IoMemory& operator=(const IoMemory&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;  // the mapped length: n rounded up to 4 KiB
};

}  // namespace fastckpt
