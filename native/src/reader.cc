// reader.cc — the definitions of reader.h: ranges cut into parts that a few threads take in turn,
// a cold part read around the page cache.
#include "fastckpt/reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "fastckpt/crc.h"
#include "fastckpt/file_io.h"
#include "fastckpt/io_memory.h"
#include "fastckpt/stream_copy.h"

namespace fastckpt {

namespace {

// A cold read goes around the page cache: O_DIRECT into a bounce buffer of this size (one read
// puts many requests in flight at once), each block of it CRC'd and then copied out while it is
// in this core's cache. Through the page cache the same bytes cost a page allocated and a kernel
// copy per 4 KiB on top: on this project's VM (2 cores) a cold 1 GiB read into a caller's
// tensors took 0.73-0.81 s that way, against an O_DIRECT read's 0.33 s.
constexpr uint64_t kBounce = uint64_t{32} << 20;
constexpr uint64_t kBlock = uint64_t{256} << 10;
// Parts smaller than this are read through the page cache (a bounce buffer's cost is not repaid).
constexpr uint64_t kDirectFrom = uint64_t{4} << 20;
// Threads that read directly, each with its own bounce buffer: while one waits for the disk the
// others CRC and copy.
constexpr size_t kDirectThreads = 4;

// Which of a file's pages are in the page cache, read once for the whole file (mincore over one
// mapping of it): a direct read would fetch a cached page from the disk again, a read through the
// cache copies it from memory.
class Residency {
 public:
  Residency(int fd, uint64_t size) : page_(static_cast<uint64_t>(::sysconf(_SC_PAGESIZE))) {
    if (size == 0) return;
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) return;
    in_.resize((size + page_ - 1) / page_);
    if (::mincore(map, size, in_.data()) != 0) in_.clear();
    ::munmap(map, size);
  }
  // Whether at least half of the bytes [off, off + len) are cached (true where it cannot be told).
  bool mostly(uint64_t off, uint64_t len) const {
    if (in_.empty() || len == 0) return true;
    const uint64_t first = off / page_, end = std::min<uint64_t>(in_.size(), (off + len + page_ - 1) / page_);
    size_t cached = 0;
    for (uint64_t p = first; p < end; ++p) cached += in_[p] & 1;
    return end <= first || cached * 2 >= end - first;
  }

 private:
  uint64_t page_;
  std::vector<unsigned char> in_;  // one entry per page; empty: not known
};

// A direct read the kernel refused (EINVAL: a block size above 4 KiB, a filesystem that opens with
// O_DIRECT but reads without it): the part is read through the page cache instead.
struct DirectRefused {};

// Bytes [off, off + len) of a file opened with O_DIRECT (off aligned to kAlign) into dst through
// the bounce buffer; returns their CRC-32 (0 without with_crc). Throws DirectRefused.
uint32_t read_direct(int dfd, uint8_t* bounce, uint8_t* dst, uint64_t off, uint64_t len, bool with_crc,
                     const std::string& path) {
  uint32_t crc = 0;
  for (uint64_t o = 0; o < len; o += kBounce) {
    const uint64_t n = std::min(kBounce, len - o), want = round_up(n, kAlign);
    uint64_t got = 0;
    while (got < n) {
      const ssize_t r = ::pread(dfd, bounce + got, want - got, static_cast<off_t>(off + o + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && errno == EINVAL) throw DirectRefused{};
      if (r < 0) throw_io("read (O_DIRECT)", path, off + o + got, errno);
      if (r == 0 || (static_cast<uint64_t>(r) % kAlign != 0 && got + r < n))
        throw IoError("read failed on '" + path + "' at offset " + std::to_string(off + o + got) +
                          ": the file ends before the range does",
                      EIO);
      got += static_cast<uint64_t>(r);
    }
    for (uint64_t b = 0; b < n; b += kBlock) {
      const uint64_t k = std::min(kBlock, n - b);
      if (with_crc) crc = crc32_update(crc, bounce + b, k);
      copy_past_cache(dst + o + b, bounce + b, k);
    }
  }
  return crc;
}

}  // namespace

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
    bool direct;
  };
  std::vector<Part> parts;
  for (size_t r = 0; r < ranges.size(); ++r)
    for (uint64_t o = 0; o < ranges[r].len || (o == 0 && ranges[r].len == 0); o += split_bytes) {
      parts.push_back({r, o, std::min(split_bytes, ranges[r].len - o), false});
      if (ranges[r].len == 0) break;
    }
  // the parts read around the page cache: large, aligned, and not already cached
  int dfd = -1;
#ifdef O_DIRECT
  bool opened = false;  // tried once: refused here (EINVAL on tmpfs and many FUSE filesystems), no part is direct
  std::unique_ptr<Residency> cached;  // read once, when a part is large and aligned enough to ask
  for (Part& p : parts) {
    const uint64_t at = ranges[p.range].file_off + p.off;
    p.direct = p.len >= kDirectFrom && at % kAlign == 0;
    if (p.direct && !cached) cached = std::make_unique<Residency>(fd, static_cast<uint64_t>(::lseek(fd, 0, SEEK_END)));
    p.direct = p.direct && !cached->mostly(at, p.len);
    if (p.direct && !opened) {
      opened = true;
      dfd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    }
    if (dfd < 0) p.direct = false;
  }
#endif
  const bool any_direct = dfd >= 0;
  uint64_t bounce_bytes = 0;  // one per reading thread, as large as the largest direct part needs
  for (const Part& p : parts)
    if (p.direct) bounce_bytes = std::max(bounce_bytes, std::min(kBounce, round_up(p.len, kAlign)));
  std::vector<uint32_t> part_crc(parts.size(), 0);
  std::string error;
  std::mutex mu;
  std::atomic<size_t> next{0};
  auto work = [&](int own) {
    std::unique_ptr<IoMemory> bounce;
    for (size_t i = next++; i < parts.size(); i = next++) {
      const Part& p = parts[i];
      const ReadRange& rr = ranges[p.range];
      uint8_t* dst = reinterpret_cast<uint8_t*>(rr.dst + p.off);
      try {
        bool done = false;
        if (p.direct) {
          if (!bounce) bounce = std::make_unique<IoMemory>(bounce_bytes);
          try {
            part_crc[i] = read_direct(dfd, bounce->data(), dst, rr.file_off + p.off, p.len, with_crc, path);
            done = true;
          } catch (const DirectRefused&) {  // read again below, through the page cache
          }
        }
        if (!done) {
          pread_full(own, dst, p.len, rr.file_off + p.off, path);
          if (with_crc) part_crc[i] = crc32_update(0, dst, p.len);
        }
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
    const size_t want = any_direct ? std::min(threads, kDirectThreads) : threads;
    size_t n = std::max<size_t>(1, std::min(want, parts.size()));
    std::vector<std::thread> pool;
    for (size_t t = 1; t < n; ++t) pool.emplace_back(work_own);
    work(fd);
    for (auto& t : pool) t.join();
  }
  if (dfd >= 0) ::close(dfd);
  ::close(fd);
  if (!error.empty()) throw IoError(error, EIO);
  std::vector<uint32_t> out(ranges.size(), 0);
  for (size_t i = 0; i < parts.size(); ++i)
    out[parts[i].range] = crc32_concat(out[parts[i].range], part_crc[i], parts[i].len);
  return out;
}

bool file_mostly_cached(const std::string& path) {
  UniqueFd fd(open_or_throw(path, O_RDONLY));
  const off_t size = ::lseek(fd.get(), 0, SEEK_END);
  return size > 0 && Residency(fd.get(), static_cast<uint64_t>(size)).mostly(0, static_cast<uint64_t>(size));
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
    copy_past_cache(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n);
    return;
  }
  std::vector<std::thread> pool;
  size_t step = (n / k + kAlign - 1) / kAlign * kAlign;
  for (size_t t = 0; t < k; ++t) {
    size_t off = t * step;
    if (off >= n) break;
    size_t len = std::min(step, n - off);
    pool.emplace_back([=] {
      copy_past_cache(static_cast<uint8_t*>(dst) + off, static_cast<const uint8_t*>(src) + off, len);
    });
  }
  for (auto& t : pool) t.join();
}

}  // namespace fastckpt
