// sink.h — where a write job's bytes go, as the job sees it: made ready once (on a writer
// thread, before the first byte), bytes put at their file offsets, made durable, finished.
// Two sinks: a file (file_sink.h) and a region of a mapped pool (mapped_sink.h). The job
// (write_job.h) decides where its bytes come from (its Source) and which thread runs what;
// the sink decides how they land. Mirrors fastckpt/write/protocol.py (FileSink, MappedSink).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fastckpt {

class Sink {
 public:
  virtual ~Sink() = default;
  // Throws std::invalid_argument when the data extent [begin, end) of a file of file_size
  // bytes cannot land here.
  virtual void check_extent(uint64_t begin, uint64_t end, uint64_t file_size) const = 0;
  // Whether open() must run before the first put (a file is created and preallocated).
  virtual bool needs_open() const = 0;
  virtual void open() {}
  // Stores len bytes of src at file offset off (throws IoError). may_direct: src, len and off
  // are aligned as O_DIRECT wants.
  virtual void put(const void* src, uint64_t len, uint64_t off, bool may_direct) = 0;
  // Where put() belongs: a store into memory runs on the copy threads, a system call on the
  // writer threads.
  virtual bool put_on_copy_thread() const = 0;
  // Whether put() is a copy the CPU makes (into the page cache, or a mapping) rather than one the
  // device makes (O_DIRECT): a staged chunk's put, off the gate, then runs on the lower-priority
  // CRC threads instead of the writers, whose puts only wait on the device.
  virtual bool put_is_cpu_copy() const = 0;
  // Makes [off, off + len) durable. persist_with_put(): it must run on the thread that put the
  // bytes (a store fence); otherwise it may be left to a writer thread (msync).
  virtual void persist(uint64_t off, uint64_t len) = 0;
  virtual bool persist_with_put() const = 0;
  // Where the byte at file offset off lies once put, when another thread may read it back there
  // (a file's mapping): the job then sums what a copy thread put on a CRC thread, after the
  // copy, rather than in the same pass. nullptr: summed in the same pass as the put.
  virtual const uint8_t* stored_at(uint64_t) const { return nullptr; }
  // After every put: the header blobs at their offsets, the final size, all durable.
  virtual void finish(const std::vector<std::pair<uint64_t, std::string>>& blobs, uint64_t file_size) = 0;
  // Whether some block went through O_DIRECT; whether O_DIRECT was asked for and the kernel
  // refused it (at open or at a write), so that blocks that could have bypassed the page cache
  // were written buffered instead.
  virtual bool used_direct_io() const { return false; }
  virtual bool direct_io_refused() const { return false; }
};

}  // namespace fastckpt
