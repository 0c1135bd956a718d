// gfd's Python module (gfd._gfd): engines, transfers, cache sets and host pools on the public
// C++ API, and the testing hooks (testing.cpp). Tensors and integers come in through arrays.cpp
// convert.cpp and options.cpp (declared in ext.hpp), cache sets through caches.cpp, pinned host pools go out
// through buffers.cpp. The Python package (python/gfd/__init__.py) wraps these in the public
// classes; it resolves streams (torch's current stream) and keeps the Python objects of a
// transfer alive until it is done.
//
// Threading: every call that may block or take long (engine creation and shutdown, planning and
// gathering, waiting, pinning a pool) runs with the GIL released. Python objects are only touched
// with the GIL held.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "buffers.hpp"
#include "engine_holder.hpp"
#include "ext.hpp"
#include "gfd/gfd.hpp"

namespace gfd::python {

PyEngine::PyEngine(py::handle device, const py::dict& kwargs, bool from_env) {
  EngineOptions o = from_env ? EngineOptions::from_env() : EngineOptions{};
  if (!device.is_none()) o.device = static_cast<int>(int_arg(device, "Engine: device", 0, INT32_MAX));
  o = options_from(o, kwargs);
  auto h = std::make_shared<EngineHolder>();
  h->ordinal = o.device;
  {
    py::gil_scoped_release nogil;
    KeepCurrentDevice keep;
    h->engine.emplace(o);
  }
  holder_ = std::move(h);
}

void PyEngine::close() {
  std::shared_ptr<EngineHolder> h = std::move(holder_);
  py::gil_scoped_release nogil;
  h.reset();  // waits for the engine's transfers (unless a call in flight still holds it)
}

py::dict PyEngine::options() const { return options_dict(holder()->engine->options()); }

py::dict PyEngine::stats() const {
  EngineStats s;
  {
    auto h = holder();
    py::gil_scoped_release nogil;
    s = h->engine->stats();
  }
  return stats_dict(s);
}

cudaStream_t PyEngine::stream_of(const EngineHolder& h, py::handle stream, const std::string& fn) const {
  if (stream.is_none()) return h.default_stream;  // nullptr (CUDA's default stream) except when emulated
  return reinterpret_cast<cudaStream_t>(
      static_cast<std::uintptr_t>(uint_arg(stream, fn + ": stream", UINTPTR_MAX)));
}

std::unique_ptr<PyTransfer> PyEngine::copy(Direction dir, py::handle src, py::handle dst, py::handle sizes,
                                           py::handle stream) {
  const std::string fn = dir == Direction::kToDevice ? "copy_to_device" : "copy_to_host";
  auto h = holder();
  const cudaStream_t st = stream_of(*h, stream, fn);
  IntArray s = int_array(src, fn + ": src_ptrs", false);
  IntArray d = int_array(dst, fn + ": dst_ptrs", false);
  IntArray n = int_array(sizes, fn + ": sizes", true);
  for (const IntArray* a : {&s, &d, &n})
    if (a->ndim != 1 && !a->scalar)
      bad_argument(a->name + ": must be 1-D, got " + std::to_string(a->ndim) + " dimensions");
  if (s.rows() != d.rows())
    bad_argument(fn + ": src_ptrs has " + std::to_string(s.rows()) + " entries, dst_ptrs " + std::to_string(d.rows()));
  if (!n.scalar && n.rows() != s.rows())
    bad_argument(fn + ": sizes has " + std::to_string(n.rows()) + " entries, src_ptrs " + std::to_string(s.rows()));
  const std::size_t count = s.rows();
  const bool host_src = dir == Direction::kToDevice;
  // No block is larger than the address space; checked before any sum or end address is formed.
  const std::uint64_t max_block = host_address_end();
  const std::string size_limit = "a block is at most " + std::to_string(max_block) + " bytes";
  if (n.scalar) (void)n.at(0, 0, max_block, size_limit);  // checked even when no block uses it
  Transfer t;
  try {
    py::gil_scoped_release nogil;
    std::vector<BlockCopy> blocks(count);
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const std::uint64_t a = s.at(i, 0, UINT64_MAX), b = d.at(i, 0, UINT64_MAX);
      const std::uint64_t c = n.at(i, 0, max_block, size_limit);
      const IntArray& host = host_src ? s : d;
      const IntArray& dev = host_src ? d : s;
      const std::uint64_t hp = host_src ? a : b, dp = host_src ? b : a;
      check_host_range(hp, c, host.element(i, 0), i);
      if (dp > UINT64_MAX - c)
        bad_argument(dev.element(i, 0) + ": device address + " + std::to_string(c) +
                         " bytes runs past the end of the address space",
                     i);
      if (__builtin_add_overflow(total, c, &total))
        bad_argument(n.element(i, 0) + ": the sizes sum to more than 2**64 bytes", i);
      blocks[i] = {reinterpret_cast<const void*>(a), reinterpret_cast<void*>(b), static_cast<std::size_t>(c)};
    }
    t = dir == Direction::kToDevice ? h->engine->copy_to_device(blocks, st) : h->engine->copy_to_host(blocks, st);
  } catch (const Error& e) {
    const std::string m = e.what();
    if (m.rfind(fn, 0) == 0) throw;
    throw Error(e.code(), fn + ": " + m, e.block());
  }
  auto out = std::make_unique<PyTransfer>(std::move(t));
  for (const IntArray* a : {&s, &d, &n})
    if (a->owner) out->keep.append(a->owner);
  return out;
}

std::shared_ptr<PyCacheSet> PyEngine::register_caches(py::handle host, py::handle device, const Names& host_names,
                                                      const Names& device_names) {
  auto h = holder();
  for (const auto& [v, what] : {std::pair{host, "host"}, std::pair{device, "device"}})
    if (!PySequence_Check(v.ptr()) || py::isinstance<py::str>(v))
      bad_type(std::string("register_caches: ") + what + ": expected a list of tensors, got " + type_name(v));
  const py::sequence hs = py::reinterpret_borrow<py::sequence>(host);
  const py::sequence ds = py::reinterpret_borrow<py::sequence>(device);
  auto set = register_tensors(*h, hs, ds, host_names, device_names);
  for (py::handle t : hs) set->keep.append(t);
  for (py::handle t : ds) set->keep.append(t);
  return set;
}

std::unique_ptr<PyTransfer> PyEngine::copy_blocks(const PyCacheSet& set, Direction dir, py::handle src_ids,
                                                  py::handle dst_ids, py::handle stream) {
  auto h = holder();
  if (set.engine != h.get()) bad_argument("copy_blocks: caches: a CacheSet of another engine");
  return copy_on_set(*h, set, dir, src_ids, dst_ids, stream_of(*h, stream, "copy_blocks"));
}

py::list PyEngine::copy_blocks_sets(const std::vector<std::shared_ptr<PyCacheSet>>& sets, Direction dir,
                                   py::handle src_ids, py::handle dst_ids, py::handle stream, py::handle after_each) {
  auto h = holder();
  return copy_on_sets(*h, sets, dir, src_ids, dst_ids, stream_of(*h, stream, "copy_blocks"), after_each);
}

}  // namespace gfd::python

using namespace gfd;
using namespace gfd::python;

PYBIND11_MODULE(_gfd, m) {
  m.doc() = "gfd's compiled core; use the gfd package.";
  m.attr("__version__") = GFD_VERSION;  // project(gfd VERSION ...), the version's one source

  register_error_type(m);
  m.attr("option_names") = py::cast(option_names());
  m.attr("stats_names") = py::cast(stats_names());
  m.attr("default_options") = options_dict(EngineOptions{});
  m.attr("dtype_names") = py::cast(dtype_names());
  m.def("backend_names", [] {
    std::vector<std::string> v;
    for (Backend b : kAllBackends) v.emplace_back(to_string(b));
    return v;
  });
  m.def("cuda_device_count", [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
  }, "Usable CUDA devices (0 without a driver or GPU).");

  // The conversion layer, for the package's Python code (gfd.kv_worker): the same rules and
  // messages as every compiled call.
  m.def("_int", [](py::handle v, const std::string& name, std::int64_t lo, std::int64_t hi) {
    return int_arg(v, name, lo, hi);
  }, py::arg("value"), py::arg("name"), py::arg("lo"), py::arg("hi"));
  m.def("_ints", [](py::handle v, const std::string& name, std::int64_t hi) {
    // A 1-D integer array or list as a list of Python ints in [0, hi].
    IntArray a = int_array(v, name, false);
    if (a.ndim != 1) bad_argument(name + ": must be 1-D, got " + std::to_string(a.ndim) + " dimensions");
    py::list out(a.rows());
    for (std::size_t i = 0; i < a.rows(); ++i)
      out[i] = py::int_(a.at(i, 0, static_cast<std::uint64_t>(hi)));
    return out;
  }, py::arg("value"), py::arg("name"), py::arg("hi"));
  m.def("_int64_array", [](py::handle v, const std::string& name, std::int64_t hi, const std::string& limit) {
    // A 1-D integer array or list as int64 bytes, every value in [0, hi] (numpy.frombuffer reads them).
    IntArray a = int_array(v, name, false);
    if (a.ndim != 1) bad_argument(name + ": must be 1-D, got " + std::to_string(a.ndim) + " dimensions");
    std::string out(a.rows() * 8, '\0');
    for (std::size_t i = 0; i < a.rows(); ++i) {
      const auto x = static_cast<std::int64_t>(a.at(i, 0, static_cast<std::uint64_t>(hi), limit));
      std::memcpy(out.data() + 8 * i, &x, 8);
    }
    return py::bytes(out);
  }, py::arg("value"), py::arg("name"), py::arg("hi"), py::arg("limit") = "");

  m.def("_shape", [](py::handle v, const std::string& name) { return py::tuple(py::cast(shape_from(v, name))); },
        py::arg("value"), py::arg("name"));

  py::class_<PyTransfer>(m, "_Transfer")
      .def("done", &PyTransfer::done)
      .def("wait", [](PyTransfer& t, py::handle timeout) {
        std::optional<double> limit;
        if (!timeout.is_none()) {
          if (PyBool_Check(timeout.ptr()) || !(PyFloat_Check(timeout.ptr()) || PyLong_Check(timeout.ptr())))
            bad_type("wait: timeout: expected seconds (a float or int) or None, got " + type_name(timeout));
          limit = PyFloat_AsDouble(timeout.ptr());
          if (PyErr_Occurred()) {
            PyErr_Clear();
            bad_argument("wait: timeout: out of range");
          }
        }
        return t.wait(limit);
      }, py::arg("timeout") = py::none())
      .def("error", &PyTransfer::error)
      .def_property_readonly("bytes", &PyTransfer::bytes)
      .def_readwrite("keep", &PyTransfer::keep);

  py::class_<PyEngine> engine(m, "_Engine");
  engine
      .def(py::init<py::handle, const py::dict&, bool>(), py::arg("device"), py::arg("options"), py::arg("from_env"))
      .def("close", &PyEngine::close)
      .def_property_readonly("closed", &PyEngine::closed)
      .def_property_readonly("emulated", &PyEngine::emulated)
      .def_property_readonly("device", &PyEngine::device)
      .def("options", &PyEngine::options)
      .def("stats", &PyEngine::stats)
      .def("copy_to_device", [](PyEngine& e, py::handle s, py::handle d, py::handle n, py::handle st) {
        return e.copy(Direction::kToDevice, s, d, n, st);
      })
      .def("copy_to_host", [](PyEngine& e, py::handle s, py::handle d, py::handle n, py::handle st) {
        return e.copy(Direction::kToHost, s, d, n, st);
      })
      .def("register_caches", &PyEngine::register_caches)
      .def("copy_blocks", [](PyEngine& e, const PyCacheSet& set, py::handle direction, py::handle s, py::handle d,
                             py::handle st) {
        return e.copy_blocks(set, direction_arg(direction, "copy_blocks: direction"), s, d, st);
      })
      .def("copy_blocks_sets", [](PyEngine& e, const std::vector<std::shared_ptr<PyCacheSet>>& sets,
                                  py::handle direction, py::handle s, py::handle d, py::handle st, py::handle each) {
        return e.copy_blocks_sets(sets, direction_arg(direction, "copy_blocks: direction"), s, d, st, each);
      });

  py::class_<PyCacheSet, std::shared_ptr<PyCacheSet>>(m, "_CacheSet")
      .def_property_readonly("pairs", [](const PyCacheSet& s) { return s.pairs; })
      .def_property_readonly("host_pinned", [](const PyCacheSet& s) { return s.set.host_pinned(); })
      .def_property_readonly("bytes_per_id", [](const PyCacheSet& s) { return s.set.bytes_per_id(); })
      .def_property_readonly("host_blocks", [](const PyCacheSet& s) { return s.set.host_blocks(); })
      .def_property_readonly("device_blocks", [](const PyCacheSet& s) { return s.set.device_blocks(); })
      .def_property_readonly("device", [](const PyCacheSet& s) { return s.set.device(); });

  register_buffers(m);
  register_testing(m, engine);
}
