// memory_file_sink.cc — the definitions of memory_file_sink.h.
#include "fastckpt/memory_file_sink.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>

#include "fastckpt/file_io.h"
#include "fastckpt/memory_maps.h"

namespace fastckpt {

namespace {
constexpr long kTmpfsMagic = 0x01021994;  // TMPFS_MAGIC (linux/magic.h)
}

MemoryFileSink::MemoryFileSink(std::string path, uint64_t file_size) : path_(std::move(path)), size_(file_size) {}

MemoryFileSink::~MemoryFileSink() { close(); }

void MemoryFileSink::check_extent(uint64_t, uint64_t end, uint64_t file_size) const {
  if (end > file_size) throw std::invalid_argument("data extent past end of file");
}

void MemoryFileSink::close() {
  if (map_ != nullptr) give_back_memory_map(map_);
  map_ = nullptr;
}

// The descriptor is closed as soon as the file is mapped: a process forked while the save runs (a
// DataLoader's worker) would otherwise keep it open, and the file's pages allocated after the tier
// deletes it, for as long as it lives (the registry's own descriptor it closes: memory_maps.h).
void MemoryFileSink::open() {
  UniqueFd fd(open_cut_to(path_, O_RDWR, size_));
  if (size_ > 0) map_ = take_memory_map(fd.get(), path_, size_);
  opened_ = true;
}

void MemoryFileSink::finish(const std::vector<std::pair<uint64_t, std::string>>& blobs, uint64_t file_size) {
  if (!opened_) throw std::logic_error("file was never opened");
  for (const auto& [off, bytes] : blobs) {
    if (off > size_ || bytes.size() > size_ - off) throw std::invalid_argument("a header blob past end of file");
    std::memcpy(map_ + off, bytes.data(), bytes.size());
  }
  if (map_ != nullptr) give_back_memory_map(map_);  // held on: the copy to the disk reads it there
  map_ = nullptr;
  // by its path (nothing renames a part while it is written); tmpfs has nothing below it to sync
  if (::truncate(path_.c_str(), static_cast<off_t>(file_size)) != 0) throw_io("truncate", path_, 0, errno);
}

bool on_memory_filesystem(const std::string& path) {
  struct statfs fs {};
  if (::statfs(path.c_str(), &fs) != 0) return false;
  return static_cast<long>(fs.f_type) == kTmpfsMagic;
}

}  // namespace fastckpt
