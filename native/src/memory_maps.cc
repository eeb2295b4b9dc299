// memory_maps.cc — the definitions of memory_maps.h: one registry per process, under one lock.
#include "fastckpt/memory_maps.h"

#include <fcntl.h>
#include <pthread.h>
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

// A mapping made outside the registry (its file's held one was in use): unmapped when given back.
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

// Fork (a DataLoader's workers, multiprocessing): a child gets none of the mappings (each is
// MADV_DONTFORK) and none of the registry's descriptors, which it would otherwise hold open until
// it exits, keeping every deleted part's pages allocated in the tier. The lock is taken across the
// fork so the child's copy of the registry is whole; the child then empties it.
void before_fork();
void after_fork_parent();
void after_fork_child();

Registry& registry() {
  static Registry* r = [] {  // never destroyed: mappings may be given back at exit
    auto* made = new Registry();
    ::pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    return made;
  }();
  return *r;
}

void before_fork() { registry().mu.lock(); }
void after_fork_parent() { registry().mu.unlock(); }
void after_fork_child() {
  Registry& r = registry();
  for (const Held& h : r.held) ::close(h.fd);  // the child's duplicates; its mappings were not inherited
  r.held.clear();
  r.loose.clear();
  r.mu.unlock();
}

void unmap(const Held& h) {
  ::munmap(h.addr, h.len);
  ::close(h.fd);
}

bool deleted(const Held& h) {
  struct stat st {};
  return ::fstat(h.fd, &st) != 0 || st.st_nlink == 0;
}

// Under the lock: moves out of the registry every unused mapping of a deleted file (or every
// unused one), then the least recently used unused ones beyond kMaxMaps; the caller unmaps them
// once the lock is released (unmapping 64 MiB takes milliseconds others need not wait).
std::vector<Held> purge_locked(Registry& r, bool everything) {
  std::vector<Held> dropped;
  for (auto it = r.held.begin(); it != r.held.end();) {
    if (it->users == 0 && (everything || deleted(*it))) {
      dropped.push_back(*it);
      it = r.held.erase(it);
    } else {
      ++it;
    }
  }
  while (r.held.size() > kMaxMaps) {
    auto lru = r.held.end();
    for (auto it = r.held.begin(); it != r.held.end(); ++it)
      if (it->users == 0 && (lru == r.held.end() || it->used_at < lru->used_at)) lru = it;
    if (lru == r.held.end()) break;  // every one in use
    dropped.push_back(*lru);
    r.held.erase(lru);
  }
  return dropped;
}

void unmap_all(const std::vector<Held>& dropped) {
  for (const Held& h : dropped) unmap(h);
}

uint8_t* map_populated(int fd, const std::string& path, uint64_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) throw_io("mmap", path, 0, errno);
  ::madvise(p, size, MADV_DONTFORK);  // see before_fork: a child gets none of it
  return static_cast<uint8_t*>(p);
}

}  // namespace

uint8_t* take_memory_map(int fd, const std::string& path, uint64_t size) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_io("fstat", path, 0, errno);
  Registry& r = registry();
  std::vector<Held> dropped;
  uint8_t* reused = nullptr;
  {
    std::lock_guard<std::mutex> lk(r.mu);
    dropped = purge_locked(r, false);
    auto it = std::find_if(r.held.begin(), r.held.end(),
                           [&](const Held& h) { return h.dev == st.st_dev && h.ino == st.st_ino; });
    // Held, unused, long enough, and the file still holds every page up to size (a recycled file
    // cut no shorter): the pages are reserved and present.
    const bool whole = static_cast<uint64_t>(st.st_size) >= size && static_cast<uint64_t>(st.st_blocks) * 512 >= size;
    if (it != r.held.end() && it->users == 0 && it->len >= size && whole) {
      ++it->users;
      it->used_at = ++r.clock;
      reused = it->addr;
    } else if (it != r.held.end() && it->users == 0) {  // too short, or its pages cut: mapped again below
      dropped.push_back(*it);
      r.held.erase(it);
    }
  }
  unmap_all(dropped);
  if (reused) return reused;
  // Outside the lock: reserving and faulting in the pages is the slow part.
  if (int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(size)); rc != 0) throw_io("fallocate", path, 0, rc);
  uint8_t* addr = map_populated(fd, path, size);
  const int dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) {
    const int err = errno;
    ::munmap(addr, size);
    throw_io("dup", path, 0, err);
  }
  {
    std::lock_guard<std::mutex> lk(r.mu);
    const bool in_use = std::any_of(r.held.begin(), r.held.end(), [&](const Held& h) {
      return h.dev == st.st_dev && h.ino == st.st_ino;
    });
    if (in_use) {  // held for another user of the same file meanwhile: this one is not kept
      ::close(dup);
      r.loose.push_back({addr, size});
      return addr;
    }
    r.held.push_back({st.st_dev, st.st_ino, dup, addr, size, 1, ++r.clock});
    dropped = purge_locked(r, false);
  }
  unmap_all(dropped);
  return addr;
}

uint8_t* find_memory_map(const std::string& path, uint64_t size) {
  struct stat st {};
  const bool there = ::stat(path.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) >= size;
  Registry& r = registry();
  std::vector<Held> dropped;
  uint8_t* found = nullptr;
  {
    std::lock_guard<std::mutex> lk(r.mu);
    dropped = purge_locked(r, false);
    if (there)
      for (Held& h : r.held)
        if (h.dev == st.st_dev && h.ino == st.st_ino && h.len >= size) {
          ++h.users;
          h.used_at = ++r.clock;
          found = h.addr;
          break;
        }
  }
  unmap_all(dropped);
  return found;
}

void give_back_memory_map(uint8_t* addr) {
  Registry& r = registry();
  Loose gone{nullptr, 0};
  {
    std::lock_guard<std::mutex> lk(r.mu);
    for (Held& h : r.held)
      if (h.addr == addr) {
        if (h.users > 0) --h.users;
        return;
      }
    for (auto it = r.loose.begin(); it != r.loose.end(); ++it)
      if (it->addr == addr) {
        gone = *it;
        r.loose.erase(it);
        break;
      }
  }
  if (gone.addr) ::munmap(gone.addr, gone.len);
}

size_t purge_memory_maps(bool everything) {
  Registry& r = registry();
  std::vector<Held> dropped;
  {
    std::lock_guard<std::mutex> lk(r.mu);
    dropped = purge_locked(r, everything);
  }
  unmap_all(dropped);
  return dropped.size();
}

size_t held_memory_maps() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  return r.held.size();
}

}  // namespace fastckpt
