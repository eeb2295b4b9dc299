// mapped_region.h — what a mapped sink (mapped_sink.h) needs of the region it stores straight
// into (a persistent-memory pool: pmem_pool.h): its size, a copy in, and the persist of that
// copy. The write path knows only this interface, not the pool behind it.
#pragma once
#include <cstdint>
#include <string>

namespace fastckpt {

class MappedRegion {
 public:
  virtual ~MappedRegion() = default;
  virtual uint64_t size() const = 0;
  virtual const std::string& path() const = 0;
  // Copies src to [off, off + n); persistent once persist_copied(off, n) returns.
  virtual void copy_in(uint64_t off, const void* src, uint64_t n) const = 0;
  virtual void persist_copied(uint64_t off, uint64_t n) const = 0;
  // True where persist_copied must run on the thread that did the copy (a store fence).
  virtual bool fence_on_copy_thread() const = 0;
};

}  // namespace fastckpt
