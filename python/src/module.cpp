// gfd's compiled module, gfd._gfd: the classes (engine.cpp, transfer.cpp, cache_set.cpp,
// host_pool.cpp, buffer.cpp), the module's constants and the testing hooks (testing.cpp). The
// package (python/gfd/__init__.py) re-exports them.
//
// Threading: every call that may block or take long (engine creation and shutdown, planning and
// gathering, waiting, pinning a pool) runs with the GIL released. Python objects are only touched
// with the GIL held.
#include <cuda_runtime_api.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <string>
#include <vector>

#include "buffer.hpp"
#include "cache_set.hpp"
#include "engine.hpp"
#include "ext.hpp"
#include "transfer.hpp"

namespace gfd::python {
// testing.cpp: the submodule gfd._gfd.testing.
void register_testing(py::module_& m);
}  // namespace gfd::python

using namespace gfd;
using namespace gfd::python;

PYBIND11_MODULE(_gfd, m) {
  m.doc() = "gfd's compiled core; use the gfd package.";
  m.attr("__version__") = GFD_VERSION;  // project(gfd VERSION ...), the version's one source

  register_error_type(m);
  m.attr("option_names") = py::tuple(py::cast(option_names()));
  m.attr("stats_names") = py::tuple(py::cast(stats_names()));
  m.attr("default_options") = options_dict(EngineOptions{});
  m.attr("dtype_names") = py::tuple(py::cast(dtype_names()));
  m.def(
      "backends",
      [] {
        std::vector<std::string> v;
        for (Backend b : kAllBackends) v.emplace_back(to_string(b));
        return v;
      },
      "Names of the transfer backends ('gather', 'batch_async', 'per_block', 'zero_copy_kernel').");
  m.def(
      "cuda_device_count",
      [] {
        int n = 0;
        return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
      },
      "Usable CUDA devices in this process (0 without a driver or a GPU).");

  // The conversion layer, for the package's Python code (gfd.kv_worker): the same rules and
  // messages as every compiled call.
  m.def(
      "_int",
      [](py::handle v, const std::string& name, std::int64_t lo, std::int64_t hi) {
        return int_arg(v, name, lo, hi);
      },
      py::arg("value"), py::arg("name"), py::arg("lo"), py::arg("hi"));
  m.def(
      "_ints",
      [](py::handle v, const std::string& name, std::int64_t hi) {
        // A 1-D integer array or list as a list of Python ints in [0, hi].
        IntArray a = int_array(v, name, false);
        if (a.ndim != 1)
          bad_argument(name + ": must be 1-D, got " + std::to_string(a.ndim) + " dimensions");
        py::list out(a.rows());
        for (std::size_t i = 0; i < a.rows(); ++i)
          out[i] = py::int_(a.at(i, 0, static_cast<std::uint64_t>(hi)));
        return out;
      },
      py::arg("value"), py::arg("name"), py::arg("hi"));
  m.def(
      "_int64_array",
      [](py::handle v, const std::string& name, std::int64_t hi, const std::string& limit) {
        // A 1-D integer array or list as int64 bytes, every value in [0, hi] (numpy.frombuffer
        // reads them).
        IntArray a = int_array(v, name, false);
        if (a.ndim != 1)
          bad_argument(name + ": must be 1-D, got " + std::to_string(a.ndim) + " dimensions");
        std::string out(a.rows() * 8, '\0');
        for (std::size_t i = 0; i < a.rows(); ++i) {
          const auto x =
              static_cast<std::int64_t>(a.at(i, 0, static_cast<std::uint64_t>(hi), limit));
          std::memcpy(out.data() + 8 * i, &x, 8);
        }
        return py::bytes(out);
      },
      py::arg("value"), py::arg("name"), py::arg("hi"), py::arg("limit") = "");

  register_transfer(m);
  register_engine(m);
  register_cache_set(m);
  register_buffer(m);
  register_host_pool(m);
  register_testing(m);
  // The classes as the package names them (gfd.Engine, not gfd._gfd.Engine) in help and reprs.
  for (const char* name : {"Engine", "Transfer", "CacheSet", "HostPool", "Buffer"})
    m.attr(name).attr("__module__") = "gfd";
  // Engines still open at exit are closed while the CUDA runtime is still there, then the
  // objects of transfers whose handles were dropped are let go.
  py::module_::import("atexit").attr("register")(py::cpp_function(&close_all_engines));
}
