// pmem_pool.cc — the definitions of pmem_pool.h: mapping the pool (libpmem2 first where it was
// built in and nothing is forced, else mmap with MAP_SYNC, else plain MAP_SHARED), and the
// fence path's primitives: cache-line write-back, non-temporal copy, store fence.
#include "fastckpt/pmem_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "fastckpt/file_io.h"
#include "fastckpt/stream_copy.h"

#ifndef MAP_SHARED_VALIDATE
#define MAP_SHARED_VALIDATE 0x03
#endif
#ifndef MAP_SYNC
#define MAP_SYNC 0x80000
#endif

namespace fastckpt {

namespace detail {

constexpr uint64_t kLine = 64;

#if defined(__x86_64__)
__attribute__((target("clwb"))) void flush_clwb(const uint8_t* p, uint64_t n) {
  for (uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~(kLine - 1); a < reinterpret_cast<uintptr_t>(p) + n;
       a += kLine)
    _mm_clwb(reinterpret_cast<void*>(a));
}
__attribute__((target("clflushopt"))) void flush_clflushopt(const uint8_t* p, uint64_t n) {
  for (uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~(kLine - 1); a < reinterpret_cast<uintptr_t>(p) + n;
       a += kLine)
    _mm_clflushopt(reinterpret_cast<void*>(a));
}
void flush_clflush(const uint8_t* p, uint64_t n) {
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
const Flusher& flusher() {
  static const Flusher f;
  return f;
}
void store_fence() { _mm_sfence(); }

// Copies with non-temporal stores (they bypass the cache, so nothing is left to
// write back); the unaligned head and tail go through the cache and are flushed.
void copy_nontemporal(uint8_t* dst, const uint8_t* src, uint64_t n) {
  uint64_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
  if (head > n) head = n;
  std::memcpy(dst, src, head);
  flusher().fn(dst, head);
  dst += head, src += head, n -= head;
  uint64_t body = n & ~uint64_t(63);
  stream_blocks(dst, src, body);
  std::memcpy(dst + body, src + body, n - body);
  flusher().fn(dst + body, n - body);
}
bool fence_path_available() { return true; }
const char* flush_name() { return flusher().name; }
#else
void store_fence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
void copy_nontemporal(uint8_t* dst, const uint8_t* src, uint64_t n) { std::memcpy(dst, src, n); }
bool fence_path_available() { return false; }
const char* flush_name() { return "none"; }
#endif

// Size of a device-dax character device, from sysfs.
uint64_t devdax_size(const struct stat& st, const std::string& path) {
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

PmemPool::PmemPool(const std::string& path, uint64_t size, bool create, int force) : path_(path) {
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

PmemPool::~PmemPool() {
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

std::string PmemPool::persist_name() const {
  if (mode_ == Persist::Lib) return "libpmem2 (" + lib_granularity_ + " granularity)";
  return mode_ == Persist::Fence ? std::string("fence (") + detail::flush_name() + " + sfence)"
                                 : std::string("msync");
}

void PmemPool::copy_in(uint64_t off, const void* src, uint64_t n) const {
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

void PmemPool::persist_copied(uint64_t off, uint64_t n) const {
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

void PmemPool::persist(uint64_t off, uint64_t n) const {
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

void PmemPool::store8(uint64_t off, uint64_t value) const {
  check(off, 8);
  if (off % 8 != 0) throw std::invalid_argument("store8 needs an 8-byte aligned offset");
  __atomic_store_n(reinterpret_cast<uint64_t*>(base_ + off), value, __ATOMIC_RELEASE);
  persist(off, 8);
}

uint64_t PmemPool::load8(uint64_t off) const {
  check(off, 8);
  return __atomic_load_n(reinterpret_cast<const uint64_t*>(base_ + off), __ATOMIC_ACQUIRE);
}

#ifdef FASTCKPT_HAVE_LIBPMEM2
bool PmemPool::map_with_libpmem2() {
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
#endif

void PmemPool::check(uint64_t off, uint64_t n) const {
  if (off > size_ || n > size_ - off)
    throw std::out_of_range("range [" + std::to_string(off) + ", +" + std::to_string(n) +
                            ") is outside the pool " + path_);
}

void PmemPool::msync_range(uint64_t off, uint64_t n) const {
  if (n == 0) return;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  uint64_t lo = off & ~(page - 1);
  if (::msync(base_ + lo, off + n - lo, MS_SYNC) != 0) throw_io("msync", path_, off, errno);
}

}  // namespace fastckpt
