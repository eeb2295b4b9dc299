// engine.cc — the definitions of engine.h: a job gets its sink here and is started on the
// engine's pool and threads.
#include "fastckpt/engine.h"

#include <utility>

#include "fastckpt/file_sink.h"
#include "fastckpt/mapped_sink.h"
#include "fastckpt/memory_file_sink.h"

namespace fastckpt {

Engine::Engine(size_t chunk_bytes, size_t copy_threads, size_t write_threads)
    : pool_(chunk_bytes), writers_(write_threads, 0, "fastckpt-write"),
      summers_(copy_threads, kBackgroundNice, "fastckpt-crc"), copiers_(copy_threads, 0, "fastckpt-copy") {}

void Engine::park() {
  copiers_.park();  // they feed the writers and CRC threads
  writers_.park();
  summers_.park();
}

std::shared_ptr<WriteJob> Engine::submit(const std::string& path, std::vector<Piece> pieces,
                                         uint64_t data_begin, uint64_t data_end, uint64_t file_size,
                                         Source source, bool direct_io, uint32_t n_records, bool held,
                                         bool memory) {
  std::unique_ptr<Sink> sink;
  if (memory)
    sink = std::make_unique<MemoryFileSink>(path, file_size);
  else
    sink = std::make_unique<FileSink>(path, file_size, direct_io);
  return start(std::move(sink), std::move(pieces), data_begin, data_end, file_size, source, n_records, held);
}

std::shared_ptr<WriteJob> Engine::submit_mapped(std::shared_ptr<const MappedRegion> region, uint64_t shift,
                                                std::vector<Piece> pieces, uint64_t data_begin,
                                                uint64_t data_end, uint32_t n_records, bool held) {
  return start(std::make_unique<MappedSink>(std::move(region), shift), std::move(pieces), data_begin,
               data_end, data_end, Source::Direct, n_records, held);
}

std::shared_ptr<WriteJob> Engine::start(std::unique_ptr<Sink> sink, std::vector<Piece> pieces,
                                        uint64_t data_begin, uint64_t data_end, uint64_t file_size,
                                        Source source, uint32_t n_records, bool held) {
  auto job = std::make_shared<WriteJob>(Workers{&pool_, &copiers_, &writers_, &summers_, &progress_, &held_sums_}, std::move(sink),
                                        std::move(pieces), data_begin, data_end, file_size, source,
                                        pool_.chunk_bytes(), n_records, held);
  job->start();
  return job;
}

}  // namespace fastckpt
