// memory_maps.h — the mappings of memory-tier files (tmpfs) this process keeps from one save to
// the next. A memory tier recycles its part files (a removed checkpoint's file is written again by
// a later save), and each save's part is read once more to be persisted to the disk. Mapping a
// 64 MiB file with its pages faulted in, reserving its pages and unmapping it again cost the
// kernel about 6 ms for each of those two passes, per save and per rank, on a machine whose cores
// training fills. So a file's mapping outlives its sink: the copy of it to the disk finds it, and
// a later save into the same (recycled) file finds it again, its pages still present.
// The registry holds a duplicate descriptor of each file it maps (the inode cannot go, nor its
// number be reused, while it is held) and knows a file by (device, inode), so renames do not
// matter. A file that was deleted (no link left) is unmapped at the next take, find or purge, once
// no one uses its mapping: its memory is freed then, not at the unlink. At most kMaxMaps mappings
// stay held; beyond that the least recently used, unused one goes.
// A forked child (a DataLoader's workers) inherits none of these mappings nor descriptors: the
// child's registry starts empty, so it never keeps a deleted part's pages allocated.
// Definitions: src/memory_maps.cc.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace fastckpt {

constexpr size_t kMaxMaps = 16;

// A writable shared mapping of bytes [0, size) of the tmpfs file open (read-write) at fd, every
// page reserved (fallocate: a full tier fails here with ENOSPC, never with a SIGBUS at a store)
// and present: the one held for this file when it covers size and the file still holds those
// pages, else a new one. The caller gives it back (give_back_memory_map) when done with it.
// Throws IoError naming path.
uint8_t* take_memory_map(int fd, const std::string& path, uint64_t size);

// The held mapping of the file at path when there is one covering size (the caller gives it back),
// else nullptr: the caller maps the file itself.
uint8_t* find_memory_map(const std::string& path, uint64_t size);

// Done with a mapping from take or find: it stays held for the next save (or is unmapped, if the
// registry dropped it meanwhile).
void give_back_memory_map(uint8_t* addr);

// Unmaps every held mapping no one uses whose file was deleted (everything == false), or every
// one no one uses (everything == true: a tier given up, or the end of the run). Returns how many.
size_t purge_memory_maps(bool everything);

// How many mappings are held now, in use or not (for tests).
size_t held_memory_maps();

}  // namespace fastckpt
