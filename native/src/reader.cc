// reader.cc — the definitions of reader.h: ranges cut into parts that a few threads take in turn.
#include "fastckpt/reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

#include "fastckpt/crc.h"
#include "fastckpt/file_io.h"

namespace fastckpt {

std::vector<uint32_t> read_ranges(const std::string& path, const std::vector<ReadRange>& ranges,
                                  size_t threads, uint64_t split_bytes, bool with_crc) {
  // Opened here first, so a missing or unreadable file fails before any thread starts; each
  // thread then reads through a descriptor of its own: the kernel keeps readahead state per open
  // file, and threads taking turns at parts far apart through one descriptor kept resetting it
  // (a cold read then went in small requests). Each is marked sequential (a larger window).
  int fd = open_or_throw(path, O_RDONLY);
  struct Part {
    size_t range;
    uint64_t off, len;
  };
  std::vector<Part> parts;
  for (size_t r = 0; r < ranges.size(); ++r)
    for (uint64_t o = 0; o < ranges[r].len || (o == 0 && ranges[r].len == 0); o += split_bytes) {
      parts.push_back({r, o, std::min(split_bytes, ranges[r].len - o)});
      if (ranges[r].len == 0) break;
    }
  std::vector<uint32_t> part_crc(parts.size(), 0);
  std::string error;
  std::mutex mu;
  std::atomic<size_t> next{0};
  auto work = [&](int own) {
    for (size_t i = next++; i < parts.size(); i = next++) {
      const Part& p = parts[i];
      const ReadRange& rr = ranges[p.range];
      void* dst = reinterpret_cast<void*>(rr.dst + p.off);
      try {
        pread_full(own, dst, p.len, rr.file_off + p.off, path);
        if (with_crc) part_crc[i] = crc32_update(0, dst, p.len);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lk(mu);
        if (error.empty()) error = e.what();
        next = parts.size();
      }
    }
  };
  auto work_own = [&] {  // a thread's own descriptor (the shared one if the file cannot be opened again)
    int own = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (own >= 0) ::posix_fadvise(own, 0, 0, POSIX_FADV_SEQUENTIAL);
    work(own >= 0 ? own : fd);
    if (own >= 0) ::close(own);
  };
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  {
    size_t n = std::max<size_t>(1, std::min(threads, parts.size()));
    std::vector<std::thread> pool;
    for (size_t t = 1; t < n; ++t) pool.emplace_back(work_own);
    work(fd);
    for (auto& t : pool) t.join();
  }
  ::close(fd);
  if (!error.empty()) throw IoError(error, EIO);
  std::vector<uint32_t> out(ranges.size(), 0);
  for (size_t i = 0; i < parts.size(); ++i)
    out[parts[i].range] = crc32_concat(out[parts[i].range], part_crc[i], parts[i].len);
  return out;
}

std::vector<uint32_t> crc_ranges(const std::vector<std::pair<uintptr_t, uint64_t>>& ranges,
                                 size_t threads, uint64_t split_bytes) {
  struct Part {
    size_t range;
    uint64_t off, len;
  };
  std::vector<Part> parts;
  for (size_t r = 0; r < ranges.size(); ++r)
    for (uint64_t o = 0; o < ranges[r].second; o += split_bytes)
      parts.push_back({r, o, std::min(split_bytes, ranges[r].second - o)});
  std::vector<uint32_t> part_crc(parts.size(), 0);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < parts.size(); i = next++)
      part_crc[i] = crc32_update(0, reinterpret_cast<const void*>(ranges[parts[i].range].first + parts[i].off),
                                 parts[i].len);
  };
  size_t n = std::max<size_t>(1, std::min(threads, parts.size()));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  std::vector<uint32_t> out(ranges.size(), 0);
  for (size_t i = 0; i < parts.size(); ++i)
    out[parts[i].range] = crc32_concat(out[parts[i].range], part_crc[i], parts[i].len);
  return out;
}

void copy_parallel(void* dst, const void* src, size_t n, size_t threads) {
  const size_t min_part = size_t(4) << 20;
  size_t k = std::max<size_t>(1, std::min(threads, n / min_part));
  if (k <= 1) {
    std::memcpy(dst, src, n);
    return;
  }
  std::vector<std::thread> pool;
  size_t step = (n / k + kAlign - 1) / kAlign * kAlign;
  for (size_t t = 0; t < k; ++t) {
    size_t off = t * step;
    if (off >= n) break;
    size_t len = std::min(step, n - off);
    pool.emplace_back([=] { std::memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, len); });
  }
  for (auto& t : pool) t.join();
}

}  // namespace fastckpt
