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
// Definitions (the flush and non-temporal copy primitives too): src/pmem_pool.cc.
#pragma once
#include <cstdint>
#include <string>

#include "fastckpt/mapped_region.h"

#ifdef FASTCKPT_HAVE_LIBPMEM2
#include <libpmem2.h>  // the pool keeps libpmem2's mapping and functions as members
#endif

namespace fastckpt {

enum class Persist : int { Fence = 0, Msync = 1, Lib = 2 };

constexpr bool has_libpmem2() {
#ifdef FASTCKPT_HAVE_LIBPMEM2
  return true;
#else
  return false;
#endif
}

namespace detail {
// The cache-line write-back the fence path uses: "clwb", "clflushopt" or "clflush" (x86-64,
// the best this CPU has), "none" elsewhere.
const char* flush_name();
}  // namespace detail

class PmemPool final : public MappedRegion {
 public:
  // force: -1 chooses (Fence on real PMEM, Msync elsewhere); 0 forces Fence; 1 forces Msync.
  // create: the file is made (or grown) to `size` bytes with its blocks reserved, so a full
  // disk fails here with ENOSPC rather than later with SIGBUS on a store into the mapping.
  PmemPool(const std::string& path, uint64_t size, bool create, int force);
  ~PmemPool();
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
  std::string persist_name() const;

  // Copies src into the pool at off; persistent once persist_copied(off, n) returns.
  void copy_in(uint64_t off, const void* src, uint64_t n) const override;
  // Persists bytes stored by copy_in (Fence: its stores are already written back; a fence
  // orders them). Other stores into the pool use persist().
  void persist_copied(uint64_t off, uint64_t n) const override;
  // Persists any bytes stored into [off, off + n).
  void persist(uint64_t off, uint64_t n) const;
  // One aligned 8-byte store, persisted: the atomic switch of a double mapping.
  void store8(uint64_t off, uint64_t value) const;
  uint64_t load8(uint64_t off) const;

 private:
#ifdef FASTCKPT_HAVE_LIBPMEM2
  // Maps through libpmem2; false (nothing changed) where it declines the file.
  bool map_with_libpmem2();
  pmem2_map* map2_ = nullptr;
  pmem2_source* src2_ = nullptr;
  pmem2_persist_fn lib_persist_ = nullptr;
  pmem2_memcpy_fn lib_memcpy_ = nullptr;
  pmem2_drain_fn lib_drain_ = nullptr;
#endif
  bool lib_fence_ = false;
  std::string lib_granularity_;

  // Throws std::out_of_range unless [off, off + n) lies inside the pool.
  void check(uint64_t off, uint64_t n) const;
  // msync(MS_SYNC) of the pages holding [off, off + n).
  void msync_range(uint64_t off, uint64_t n) const;

  std::string path_;
  int fd_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  bool map_sync_ = false;
  bool devdax_ = false;
  Persist mode_ = Persist::Msync;
};

}  // namespace fastckpt
