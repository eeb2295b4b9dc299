// bindings.cc — the pybind11 face of the native core. Only integers (raw
// addresses, sizes, offsets), strings and bytes cross it; every wait releases
// the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <thread>

#include "fastckpt/crc.h"
#include "fastckpt/engine.h"
#include "fastckpt/file_io.h"
#include "fastckpt/io_memory.h"
#include "fastckpt/memory_file_sink.h"
#include "fastckpt/memory_maps.h"
#include "fastckpt/pmem_pool.h"
#include "fastckpt/reader.h"
#include "fastckpt/tensor_io.h"

namespace py = pybind11;
using namespace fastckpt;

namespace {

py::dict features() {
  py::dict d;
  d["o_direct"] = has_o_direct();
  d["libpmem2"] = has_libpmem2();
  d["pmem_flush"] = std::string(detail::flush_name());
  d["crc32"] = crc32_backend_name();
  d["hardware_threads"] = std::thread::hardware_concurrency();
  return d;
}

std::vector<Piece> to_pieces(const std::vector<std::tuple<uintptr_t, uint64_t, uint64_t, uint32_t>>& in) {
  std::vector<Piece> out;
  out.reserve(in.size());
  for (const auto& [src, len, off, rec] : in) out.push_back({src, len, off, rec});
  return out;
}

// tensor_io.h's tools: (path, offset, raw address, length[, sync]), the GIL released.
using TensorWrite = void (*)(const std::string&, uint64_t, const void*, uint64_t, bool);
using TensorRead = void (*)(const std::string&, uint64_t, void*, uint64_t);

void def_tensor_write(py::module_& m, const char* name, TensorWrite fn) {
  m.def(name, [fn](const std::string& path, uint64_t off, uintptr_t src, uint64_t n, bool sync) {
    py::gil_scoped_release nogil;
    fn(path, off, reinterpret_cast<const void*>(src), n, sync);
  }, py::arg("path"), py::arg("off"), py::arg("src"), py::arg("n"), py::arg("sync") = false);
}

void def_tensor_read(py::module_& m, const char* name, TensorRead fn) {
  m.def(name, [fn](const std::string& path, uint64_t off, uintptr_t dst, uint64_t n) {
    py::gil_scoped_release nogil;
    fn(path, off, reinterpret_cast<void*>(dst), n);
  });
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "fastckpt native core: staging pool, copy/CRC/write pipeline, parallel reads";
  static py::exception<IoError> io_error(m, "NativeIOError", PyExc_OSError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const IoError& e) {
      PyObject* args = Py_BuildValue("(is)", e.err(), e.what());
      PyErr_SetObject(io_error.ptr(), args);
      Py_XDECREF(args);
    }
  });

  m.def("features", &features);
  m.def("on_memory_filesystem", &on_memory_filesystem, py::arg("path"));
  // memory_maps.h: a memory-tier file's mapping held from one save to the next: take (the file
  // created or cut to size, reserved and mapped), find (0: none held), give back.
  m.def("find_memory_map", [](const std::string& path, uint64_t size) {
    py::gil_scoped_release nogil;  // it may unmap a deleted file's mapping (milliseconds)
    return reinterpret_cast<uintptr_t>(find_memory_map(path, size));
  }, py::arg("path"), py::arg("size"));
  m.def("take_memory_map", [](const std::string& path, uint64_t size) {
    py::gil_scoped_release nogil;
    UniqueFd fd(open_cut_to(path, O_RDWR, size));  // the registry keeps its own descriptor
    return reinterpret_cast<uintptr_t>(take_memory_map(fd.get(), path, size));
  }, py::arg("path"), py::arg("size"));
  m.def("give_back_memory_map", [](uintptr_t addr) {
    py::gil_scoped_release nogil;
    give_back_memory_map(reinterpret_cast<uint8_t*>(addr));
  }, py::arg("addr"));
  m.def("purge_memory_maps", [](bool everything) {
    py::gil_scoped_release nogil;
    return purge_memory_maps(everything);
  }, py::arg("everything") = false);
  m.def("held_memory_maps", &held_memory_maps);
  m.def("crc32", [](uintptr_t addr, uint64_t n, uint32_t crc) {
    py::gil_scoped_release nogil;
    return crc32_update(crc, reinterpret_cast<const void*>(addr), n);
  }, py::arg("addr"), py::arg("n"), py::arg("crc") = 0);
  m.def("crc32_concat", &crc32_concat);
  m.def("copy", [](uintptr_t dst, uintptr_t src, uint64_t n, size_t threads) {
    py::gil_scoped_release nogil;
    copy_parallel(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n, threads);
  });
  m.def("read_ranges", [](const std::string& path,
                          const std::vector<std::tuple<uintptr_t, uint64_t, uint64_t>>& ranges,
                          size_t threads, uint64_t split_bytes, bool with_crc) {
    std::vector<ReadRange> rr;
    for (const auto& [dst, off, len] : ranges) rr.push_back({dst, off, len});
    py::gil_scoped_release nogil;
    return read_ranges(path, rr, threads, split_bytes, with_crc);
  });
  m.def("file_mostly_cached", &file_mostly_cached, py::arg("path"), py::call_guard<py::gil_scoped_release>());
  m.def("crc_ranges", [](const std::vector<std::pair<uintptr_t, uint64_t>>& ranges, size_t threads,
                         uint64_t split_bytes) {
    py::gil_scoped_release nogil;
    return crc_ranges(ranges, threads, split_bytes);
  });
  def_tensor_write(m, "write_buffered", &write_buffered);
  def_tensor_read(m, "read_buffered", &read_buffered);
  def_tensor_write(m, "write_direct", &write_direct);
  def_tensor_read(m, "read_direct", &read_direct);
  py::enum_<Source>(m, "Source")
      .value("Staged", Source::Staged)
      .value("Direct", Source::Direct)
      .value("External", Source::External);

  // memory O_DIRECT moves fastest (io_memory.h), as a writable buffer: torch.frombuffer keeps it alive
  py::class_<IoMemory>(m, "IoMemory", py::buffer_protocol())
      .def(py::init<size_t>(), py::arg("nbytes"), py::call_guard<py::gil_scoped_release>())
      .def_buffer([](IoMemory& mem) {
        return py::buffer_info(mem.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(mem.size())}, {1});
      })
      .def_property_readonly("address", [](const IoMemory& mem) { return reinterpret_cast<uintptr_t>(mem.data()); });
  py::class_<PmemPool, std::shared_ptr<PmemPool>>(m, "PmemPool", py::buffer_protocol())
      .def(py::init<const std::string&, uint64_t, bool, int>(), py::arg("path"), py::arg("size"),
           py::arg("create"), py::arg("force") = -1, py::call_guard<py::gil_scoped_release>())
      .def_buffer([](PmemPool& p) {
        return py::buffer_info(p.base(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(p.size())}, {1});
      })
      .def_property_readonly("address", [](const PmemPool& p) { return reinterpret_cast<uintptr_t>(p.base()); })
      .def_property_readonly("size", &PmemPool::size)
      .def_property_readonly("path", &PmemPool::path)
      .def_property_readonly("map_sync", &PmemPool::map_sync)
      .def_property_readonly("device_dax", &PmemPool::device_dax)
      .def_property_readonly("fence", &PmemPool::fence_on_copy_thread)
      .def_property_readonly("persist_name", &PmemPool::persist_name)
      .def("write", [](const PmemPool& p, uint64_t off, py::bytes data) {
        std::string b(data);
        py::gil_scoped_release nogil;
        p.copy_in(off, b.data(), b.size());
        p.persist(off, b.size());
      }, "stores bytes at off and persists them")
      .def("persist", &PmemPool::persist, py::call_guard<py::gil_scoped_release>())
      .def("store8", &PmemPool::store8)
      .def("load8", &PmemPool::load8);

  py::class_<StagingPool>(m, "StagingPool")
      .def("grow", &StagingPool::grow, py::call_guard<py::gil_scoped_release>())
      .def("acquire", &StagingPool::acquire, py::arg("timeout_s") = -1.0,
           py::call_guard<py::gil_scoped_release>())
      .def("release", &StagingPool::release)
      .def("address", [](const StagingPool& p, int slot) {
        return reinterpret_cast<uintptr_t>(p.data(slot));
      })
      .def("addresses", &StagingPool::addresses)
      .def("free_all", &StagingPool::free_all)
      .def_property_readonly("chunk_bytes", &StagingPool::chunk_bytes)
      .def_property_readonly("capacity", &StagingPool::capacity)
      .def_property_readonly("free_count", &StagingPool::free_count);

  py::class_<WriteJob, std::shared_ptr<WriteJob>>(m, "WriteJob")
      .def("wait_copied", &WriteJob::wait_copied, py::arg("timeout_s") = -1.0,
           py::call_guard<py::gil_scoped_release>())
      .def("wait_written", &WriteJob::wait_written, py::arg("timeout_s") = -1.0,
           py::call_guard<py::gil_scoped_release>())
      .def("wait_summed", &WriteJob::wait_summed, py::arg("timeout_s") = -1.0,
           py::call_guard<py::gil_scoped_release>())
      .def("release", &WriteJob::release)
      .def("release_all", &WriteJob::release_all)
      .def("wait_records_copied", &WriteJob::wait_records_copied, py::arg("records"),
           py::arg("timeout_s") = -1.0, py::call_guard<py::gil_scoped_release>())
      .def("push_chunk", &WriteJob::push_chunk)
      .def("finalize", [](WriteJob& j, const std::vector<std::pair<uint64_t, py::bytes>>& blobs,
                          uint64_t file_size) {
        std::vector<std::pair<uint64_t, std::string>> b;
        for (const auto& [off, bytes] : blobs) b.emplace_back(off, std::string(bytes));
        py::gil_scoped_release nogil;
        j.finalize(b, file_size);
      })
      .def("abort", &WriteJob::abort, py::arg("why"), py::arg("timeout_s") = -1.0,
           py::call_guard<py::gil_scoped_release>())
      .def("status", &WriteJob::status)
      .def("timings", &WriteJob::timings)
      .def("record_crcs", &WriteJob::record_crcs)
      .def("span_crcs", &WriteJob::span_crcs)
      .def("chunk_layout", &WriteJob::chunk_layout)
      .def("chunk_begin", &WriteJob::chunk_begin)
      .def("chunk_len", &WriteJob::chunk_len)
      .def_property_readonly("n_chunks", &WriteJob::n_chunks)
      .def_property_readonly("used_direct_io", &WriteJob::used_direct_io)
      .def_property_readonly("direct_io_refused", &WriteJob::direct_io_refused)
      .def_property_readonly("bytes_written", &WriteJob::bytes_written);

  py::class_<Engine>(m, "Engine")
      .def(py::init<size_t, size_t, size_t>(), py::arg("chunk_bytes"), py::arg("copy_threads"),
           py::arg("write_threads"))
      .def("submit", [](Engine& e, const std::string& path,
                        const std::vector<std::tuple<uintptr_t, uint64_t, uint64_t, uint32_t>>& pieces,
                        uint64_t data_begin, uint64_t data_end, uint64_t file_size, Source source,
                        bool direct_io, uint32_t n_records, bool held, bool memory) {
        auto p = to_pieces(pieces);
        py::gil_scoped_release nogil;
        return e.submit(path, std::move(p), data_begin, data_end, file_size, source, direct_io,
                        n_records, held, memory);
      }, py::arg("path"), py::arg("pieces"), py::arg("data_begin"), py::arg("data_end"),
         py::arg("file_size"), py::arg("source"), py::arg("direct_io"), py::arg("n_records"),
         py::arg("held") = false, py::arg("memory") = false)
      .def("submit_mapped", [](Engine& e, std::shared_ptr<PmemPool> region, uint64_t shift,
                               const std::vector<std::tuple<uintptr_t, uint64_t, uint64_t, uint32_t>>& pieces,
                               uint64_t data_begin, uint64_t data_end, uint32_t n_records, bool held) {
        auto p = to_pieces(pieces);
        py::gil_scoped_release nogil;
        return e.submit_mapped(std::move(region), shift, std::move(p), data_begin, data_end,
                               n_records, held);
      }, py::arg("region"), py::arg("shift"), py::arg("pieces"), py::arg("data_begin"),
         py::arg("data_end"), py::arg("n_records"), py::arg("held") = false)
      .def_property_readonly("pool", &Engine::pool, py::return_value_policy::reference_internal)
      .def("park", &Engine::park, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("progress", &Engine::progress)
      .def_property_readonly("copy_threads", &Engine::copy_threads)
      .def_property_readonly("write_threads", &Engine::write_threads);
}
