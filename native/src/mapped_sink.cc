// mapped_sink.cc — the definitions of mapped_sink.h: a mapped sink's checks.
#include "fastckpt/mapped_sink.h"

#include <stdexcept>

namespace fastckpt {

MappedSink::MappedSink(std::shared_ptr<const MappedRegion> region, uint64_t shift)
    : region_(std::move(region)), shift_(shift) {
  if (!region_) throw std::invalid_argument("a mapped sink needs a region");
}

void MappedSink::check_extent(uint64_t begin, uint64_t end, uint64_t) const {
  const uint64_t lo = begin + shift_, n = end - begin;
  if (lo > region_->size() || n > region_->size() - lo)
    throw std::invalid_argument("the data extent falls outside the mapped sink");
}

void MappedSink::finish(const std::vector<std::pair<uint64_t, std::string>>&, uint64_t) {
  throw std::logic_error("a mapped job has no file to finalize");
}

}  // namespace fastckpt
