// pmem_pool.h — one pool (a file, a file on an fsdax mount, or a device-dax
// character device) mapped once, and how bytes stored into it are made
// persistent (Portus §III-D, LightCheck §III-C):
//   Fence: non-temporal stores for bulk copies, cache-line write-back
//          (clwb > clflushopt > clflush) for everything else, then a store
//          fence. Correct where the mapping is real persistent memory
//          (MAP_SYNC on fsdax, or device-dax); forcible anywhere for testing.
//   Msync: msync(MS_SYNC) of the touched pages (ordinary files, /dev/shm).
//   Lib:   libpmem2 (when it was found at build time, and nothing is forced): its
//          own detection of the mapping's store granularity and its persist /
//          non-temporal memcpy / drain functions. PMEM2_FORCE_GRANULARITY is its
//          switch to run the fence path on ordinary memory.
// The layout inside the pool is the Python layer's business (fastckpt/pmem).
#pragma once
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "fastckpt/file_io.h"
#include "fastckpt/mapped_region.h"

#ifdef FASTCKPT_HAVE_LIBPMEM2
#include <libpmem2.h>
#endif

#ifndef MAP_SHARED_VALIDATE
#define MAP_SHARED_VALIDATE 0x03
#endif
#ifndef MAP_SYNC
#define MAP_SYNC 0x80000
#endif

namespace fastckpt {

enum class Persist : int { Fence = 0, Msync = 1, Lib = 2 };

inline constexpr bool has_libpmem2() {
#ifdef FASTCKPT_HAVE_LIBPMEM2
  return true;
#else
  return false;
#endif
}

namespace detail {

constexpr uint64_t kLine = 64;

#if defined(__x86_64__)
__attribute__((target("clwb"))) inline void flush_clwb(const uint8_t* p, uint64_t n) {
  for (uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~(kLine - 1); a < reinterpret_cast<uintptr_t>(p) + n;
       a += kLine)
    _mm_clwb(reinterpret_cast<void*>(a));
}
__attribute__((target("clflushopt"))) inline void flush_clflushopt(const uint8_t* p, uint64_t n) {
  for (uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~(kLine - 1); a < reinterpret_cast<uintptr_t>(p) + n;
       a += kLine)
    _mm_clflushopt(reinterpret_cast<void*>(a));
}
inline void flush_clflush(const uint8_t* p, uint64_t n) {
  for (uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~(kLine - 1); a < reinterpret_cast<uintptr_t>(p) + n;
       a += kLine)
    _mm_clflush(reinterpret_cast<void*>(a));
}

// The best cache-line write-back this CPU has.
struct Flusher {
  void (*fn)(const uint8_t*, uint64_t) = flush_clflush;
  const char* name = "clflush";
  Flusher() {
    unsigned a, b, c, d;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
      if (b & (1u << 24)) {
        fn = flush_clwb;
        name = "clwb";
      } else if (b & (1u << 23)) {
        fn = flush_clflushopt;
        name = "clflushopt";
      }
    }
  }
};
inline const Flusher& flusher() {
  static const Flusher f;
  return f;
}
inline void store_fence() { _mm_sfence(); }

// Copies with non-temporal stores (they bypass the cache, so nothing is left to
// write back); the unaligned head and tail go through the cache and are flushed.
inline void copy_nontemporal(uint8_t* dst, const uint8_t* src, uint64_t n) {
  uint64_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
  if (head > n) head = n;
  std::memcpy(dst, src, head);
  flusher().fn(dst, head);
  dst += head, src += head, n -= head;
  uint64_t body = n & ~uint64_t(63);
  for (uint64_t i = 0; i < body; i += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + body, src + body, n - body);
  flusher().fn(dst + body, n - body);
}
inline bool fence_path_available() { return true; }
inline const char* flush_name() { return flusher().name; }
#else
inline void store_fence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void copy_nontemporal(uint8_t* dst, const uint8_t* src, uint64_t n) { std::memcpy(dst, src, n); }
inline bool fence_path_available() { return false; }
inline const char* flush_name() { return "none"; }
#endif

// Size of a device-dax character device, from sysfs.
inline uint64_t devdax_size(const struct stat& st, const std::string& path) {
  char sys[128];
  std::snprintf(sys, sizeof sys, "/sys/dev/char/%u:%u/size", major(st.st_rdev), minor(st.st_rdev));
  FILE* f = std::fopen(sys, "r");
  unsigned long long n = 0;
  if (!f || std::fscanf(f, "%llu", &n) != 1) {
    if (f) std::fclose(f);
    throw IoError("cannot read the size of device-dax " + path + " from " + sys, ENODEV);
  }
  std::fclose(f);
  return n;
}

}  // namespace detail

class PmemPool final : public MappedRegion {
 public:
  // force: -1 chooses (Fence on real PMEM, Msync elsewhere); 0 forces Fence; 1 forces Msync.
  // create: the file is made (or grown) to `size` bytes with its blocks reserved, so a full
  // disk fails here with ENOSPC rather than later with SIGBUS on a store into the mapping.
  PmemPool(const std::string& path, uint64_t size, bool create, int force) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0644);
    if (fd_ < 0) throw_io("open", path, 0, errno);
    try {
      struct stat st;
      if (::fstat(fd_, &st) != 0) throw_io("fstat", path, 0, errno);
      devdax_ = S_ISCHR(st.st_mode);
      if (devdax_) {
        size_ = detail::devdax_size(st, path);
      } else if (create) {
        int err = ::posix_fallocate(fd_, 0, static_cast<off_t>(size));
        if (err != 0) throw_io("reserving the pool (posix_fallocate)", path, 0, err);
        size_ = size;
      } else {
        size_ = static_cast<uint64_t>(st.st_size);
      }
      if (size_ == 0) throw IoError("pool " + path + " is empty", EINVAL);
#ifdef FASTCKPT_HAVE_LIBPMEM2
      if (force == -1 && map_with_libpmem2()) return;
#endif
      void* p = MAP_FAILED;
      if (!devdax_) {
        p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED_VALIDATE | MAP_SYNC, fd_, 0);
        map_sync_ = p != MAP_FAILED;
      }
      if (p == MAP_FAILED) p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
      if (p == MAP_FAILED) throw_io("mmap", path, 0, errno);
      base_ = static_cast<uint8_t*>(p);
    } catch (...) {
      ::close(fd_);
      throw;
    }
    const bool real_pmem = map_sync_ || devdax_;
    mode_ = force == 0 ? Persist::Fence : force == 1 ? Persist::Msync
                                                     : (real_pmem ? Persist::Fence : Persist::Msync);
    if (mode_ == Persist::Fence && !detail::fence_path_available()) mode_ = Persist::Msync;
  }
  ~PmemPool() {
#ifdef FASTCKPT_HAVE_LIBPMEM2
    if (map2_) {
      pmem2_map_delete(&map2_);
      pmem2_source_delete(&src2_);
      base_ = nullptr;
    }
#endif
    if (base_) ::munmap(base_, size_);
    if (fd_ >= 0) ::close(fd_);
  }
  PmemPool(const PmemPool&) = delete;
  PmemPool& operator=(const PmemPool&) = delete;

  uint8_t* base() const { return base_; }
  uint64_t size() const override { return size_; }
  Persist mode() const { return mode_; }
  // True where persisting a copy is a store fence, which must run on the copying thread.
  bool fence_on_copy_thread() const override { return mode_ == Persist::Fence || (mode_ == Persist::Lib && lib_fence_); }
  bool map_sync() const { return map_sync_; }
  bool device_dax() const { return devdax_; }
  const std::string& path() const override { return path_; }
  std::string persist_name() const {
    if (mode_ == Persist::Lib) return "libpmem2 (" + lib_granularity_ + " granularity)";
    return mode_ == Persist::Fence ? std::string("fence (") + detail::flush_name() + " + sfence)"
                                   : std::string("msync");
  }

  // Copies src into the pool at off; persistent once persist_copied(off, n) returns.
  void copy_in(uint64_t off, const void* src, uint64_t n) const override {
    check(off, n);
#ifdef FASTCKPT_HAVE_LIBPMEM2
    if (mode_ == Persist::Lib && lib_fence_) {
      lib_memcpy_(base_ + off, src, n, PMEM2_F_MEM_NONTEMPORAL | PMEM2_F_MEM_NODRAIN);
      return;
    }
#endif
    if (mode_ == Persist::Fence)
      detail::copy_nontemporal(base_ + off, static_cast<const uint8_t*>(src), n);
    else
      std::memcpy(base_ + off, src, n);
  }
  // Persists bytes stored by copy_in (Fence: its stores are already written back; a fence
  // orders them). Other stores into the pool use persist().
  void persist_copied(uint64_t off, uint64_t n) const override {
#ifdef FASTCKPT_HAVE_LIBPMEM2
    if (mode_ == Persist::Lib) {
      if (lib_fence_)
        lib_drain_();
      else
        lib_persist_(base_ + off, n);
      return;
    }
#endif
    if (mode_ == Persist::Fence)
      detail::store_fence();
    else
      msync_range(off, n);
  }
  // Persists any bytes stored into [off, off + n).
  void persist(uint64_t off, uint64_t n) const {
    check(off, n);
#ifdef FASTCKPT_HAVE_LIBPMEM2
    if (mode_ == Persist::Lib) {
      lib_persist_(base_ + off, n);
      return;
    }
#endif
#if defined(__x86_64__)
    if (mode_ == Persist::Fence) {
      detail::flusher().fn(base_ + off, n);
      detail::store_fence();
      return;
    }
#endif
    msync_range(off, n);
  }
  // One aligned 8-byte store, persisted: the atomic switch of a double mapping.
  void store8(uint64_t off, uint64_t value) const {
    check(off, 8);
    if (off % 8 != 0) throw std::invalid_argument("store8 needs an 8-byte aligned offset");
    __atomic_store_n(reinterpret_cast<uint64_t*>(base_ + off), value, __ATOMIC_RELEASE);
    persist(off, 8);
  }
  uint64_t load8(uint64_t off) const {
    check(off, 8);
    return __atomic_load_n(reinterpret_cast<const uint64_t*>(base_ + off), __ATOMIC_ACQUIRE);
  }

 private:
#ifdef FASTCKPT_HAVE_LIBPMEM2
  // Maps through libpmem2; false (nothing changed) where it declines the file.
  bool map_with_libpmem2() {
    pmem2_config* cfg = nullptr;
    if (pmem2_config_new(&cfg) != 0) return false;
    bool ok = pmem2_source_from_fd(&src2_, fd_) == 0 &&
              pmem2_config_set_required_store_granularity(cfg, PMEM2_GRANULARITY_PAGE) == 0 &&
              pmem2_map_new(&map2_, cfg, src2_) == 0;
    pmem2_config_delete(&cfg);
    if (!ok) {
      if (src2_) pmem2_source_delete(&src2_);
      map2_ = nullptr;
      return false;
    }
    base_ = static_cast<uint8_t*>(pmem2_map_get_address(map2_));
    size_ = pmem2_map_get_size(map2_);
    const pmem2_granularity g = pmem2_map_get_store_granularity(map2_);
    lib_granularity_ = g == PMEM2_GRANULARITY_BYTE ? "byte" : g == PMEM2_GRANULARITY_CACHE_LINE ? "cache line" : "page";
    lib_fence_ = g != PMEM2_GRANULARITY_PAGE;
    map_sync_ = lib_fence_;
    lib_persist_ = pmem2_get_persist_fn(map2_);
    lib_memcpy_ = pmem2_get_memcpy_fn(map2_);
    lib_drain_ = pmem2_get_drain_fn(map2_);
    mode_ = Persist::Lib;
    return true;
  }
  pmem2_map* map2_ = nullptr;
  pmem2_source* src2_ = nullptr;
  pmem2_persist_fn lib_persist_ = nullptr;
  pmem2_memcpy_fn lib_memcpy_ = nullptr;
  pmem2_drain_fn lib_drain_ = nullptr;
#endif
  bool lib_fence_ = false;
  std::string lib_granularity_;

  void check(uint64_t off, uint64_t n) const {
    if (off > size_ || n > size_ - off)
      throw std::out_of_range("range [" + std::to_string(off) + ", +" + std::to_string(n) +
                              ") is outside the pool " + path_);
  }
  void msync_range(uint64_t off, uint64_t n) const {
    if (n == 0) return;
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    uint64_t lo = off & ~(page - 1);
    if (::msync(base_ + lo, off + n - lo, MS_SYNC) != 0) throw_io("msync", path_, off, errno);
  }

  std::string path_;
  int fd_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  bool map_sync_ = false;
  bool devdax_ = false;
  Persist mode_ = Persist::Msync;
};

}  // namespace fastckpt
