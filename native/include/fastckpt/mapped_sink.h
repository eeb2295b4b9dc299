// mapped_sink.h — a region of a mapped pool as a write job's sink (sink.h): file offset f lands
// at region offset f + shift. Bytes are stored straight into the mapping on the copy threads
// (no staging, no file) and made durable span by span — a store fence on the same thread, or an
// msync a writer thread may run. The pool writes its own headers: there is nothing to finish.
// Definitions: src/mapped_sink.cc.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fastckpt/mapped_region.h"
#include "fastckpt/sink.h"

namespace fastckpt {

class MappedSink final : public Sink {
 public:
  MappedSink(std::shared_ptr<const MappedRegion> region, uint64_t shift);  // throws without a region
  void check_extent(uint64_t begin, uint64_t end, uint64_t) const override;
  bool needs_open() const override { return false; }
  void put(const void* src, uint64_t len, uint64_t off, bool) override { region_->copy_in(off + shift_, src, len); }
  bool put_on_copy_thread() const override { return true; }
  bool put_is_cpu_copy() const override { return true; }  // stores into the mapping
  void persist(uint64_t off, uint64_t len) override { region_->persist_copied(off + shift_, len); }
  bool persist_with_put() const override { return region_->fence_on_copy_thread(); }
  void finish(const std::vector<std::pair<uint64_t, std::string>>&, uint64_t) override;  // throws: nothing to finish

 private:
  std::shared_ptr<const MappedRegion> region_;
  uint64_t shift_;
};

}  // namespace fastckpt
