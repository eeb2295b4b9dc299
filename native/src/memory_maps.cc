// memory_maps.cc — the definitions of memory_maps.h: one registry per process, under one lock.
#include "fastckpt/memory_maps.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <vector>

#include "fastckpt/file_io.h"

namespace fastckpt {

namespace {

struct Held {
  dev_t dev;
  ino_t ino;
  int fd;  // a duplicate: keeps the inode (and its number) alive while held
  uint8_t* addr;
  uint64_t len;
  int users;
  uint64_t used_at;  // the registry's clock at the last take or find
};

// A mapping made outside the registry (its file's held one was in use and too short): unmapped
// when given back.
struct Loose {
  uint8_t* addr;
  uint64_t len;
};

struct Registry {
  std::mutex mu;
  std::vector<Held> held;
  std::vector<Loose> loose;
  uint64_t clock = 0;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: mappings may be given back at exit
  return *r;
}

void unmap(const Held& h) {
  ::munmap(h.addr, h.len);
  ::close(h.fd);
}

bool deleted(const Held& h) {
  struct stat st {};
  return ::fstat(h.fd, &st) != 0 || st.st_nlink == 0;
}

// Under the lock: drops unused mappings of deleted files (or all unused ones), then the least
// recently used unused ones beyond kMaxMaps.
size_t purge_locked(Registry& r, bool everything) {
  size_t dropped = 0;
  for (auto it = r.held.begin(); it != r.held.end();) {
    if (it->users == 0 && (everything || deleted(*it))) {
      unmap(*it);
      it = r.held.erase(it);
      ++dropped;
    } else {
      ++it;
    }
  }
  while (r.held.size() > kMaxMaps) {
    auto lru = r.held.end();
    for (auto it = r.held.begin(); it != r.held.end(); ++it)
      if (it->users == 0 && (lru == r.held.end() || it->used_at < lru->used_at)) lru = it;
    if (lru == r.held.end()) break;  // every one in use
    unmap(*lru);
    r.held.erase(lru);
    ++dropped;
  }
  return dropped;
}

uint8_t* map_populated(int fd, const std::string& path, uint64_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) throw_io("mmap", path, 0, errno);
  return static_cast<uint8_t*>(p);
}

}  // namespace

uint8_t* take_memory_map(int fd, const std::string& path, uint64_t size) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_io("fstat", path, 0, errno);
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  purge_locked(r, false);
  auto it = std::find_if(r.held.begin(), r.held.end(),
                         [&](const Held& h) { return h.dev == st.st_dev && h.ino == st.st_ino; });
  // Held, long enough, and the file still holds every page up to size (a recycled file cut no
  // shorter): the pages are reserved and present.
  const bool whole = static_cast<uint64_t>(st.st_size) >= size && static_cast<uint64_t>(st.st_blocks) * 512 >= size;
  if (it != r.held.end() && it->users == 0 && it->len >= size && whole) {
    ++it->users;
    it->used_at = ++r.clock;
    return it->addr;
  }
  if (int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(size)); rc != 0) throw_io("fallocate", path, 0, rc);
  uint8_t* addr = map_populated(fd, path, size);
  if (it != r.held.end()) {
    if (it->users > 0) {  // in use elsewhere: this one is not kept
      r.loose.push_back({addr, size});
      return addr;
    }
    unmap(*it);
    r.held.erase(it);
  }
  const int dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) {
    const int err = errno;
    ::munmap(addr, size);
    throw_io("dup", path, 0, err);
  }
  r.held.push_back({st.st_dev, st.st_ino, dup, addr, size, 1, ++r.clock});
  purge_locked(r, false);
  return addr;
}

uint8_t* find_memory_map(const std::string& path, uint64_t size) {
  struct stat st {};
  const bool there = ::stat(path.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) >= size;
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  purge_locked(r, false);
  if (!there) return nullptr;
  for (Held& h : r.held)
    if (h.dev == st.st_dev && h.ino == st.st_ino && h.len >= size) {
      ++h.users;
      h.used_at = ++r.clock;
      return h.addr;
    }
  return nullptr;
}

void give_back_memory_map(uint8_t* addr) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  for (Held& h : r.held)
    if (h.addr == addr) {
      if (h.users > 0) --h.users;
      return;
    }
  for (auto it = r.loose.begin(); it != r.loose.end(); ++it)
    if (it->addr == addr) {
      ::munmap(it->addr, it->len);
      r.loose.erase(it);
      return;
    }
}

size_t purge_memory_maps(bool everything) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  return purge_locked(r, everything);
}

size_t held_memory_maps() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  return r.held.size();
}

}  // namespace fastckpt
