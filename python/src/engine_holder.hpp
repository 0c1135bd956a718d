// The Python module's engine and transfer holders (gfd_ext.cpp builds the module on them) and
// the cache-set calls (caches.cpp): caches described once, transfers by block ids.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "device/device.hpp"
#include "ext.hpp"
#include "gfd/gfd.hpp"

namespace gfd::python {

// The caller's CUDA device is left as it was: opening a device makes it current, and torch's
// idea of the current device must not change under a runtime.
struct KeepCurrentDevice {
  int previous = -1;
  bool had = false;
  KeepCurrentDevice() { had = cudaGetDevice(&previous) == cudaSuccess; }
  ~KeepCurrentDevice() {
    if (had) (void)cudaSetDevice(previous);
  }
};

// An engine and, for the emulated device, the stream that stands in for the default stream.
struct EngineHolder {
  std::shared_ptr<detail::Device> device;  // the emulated device, or a CUDA one for helpers
  detail::StreamHandle default_stream = nullptr;
  bool emulated = false;
  int ordinal = 0;
  std::optional<Engine> engine;
  // The device behind the engine, for stream syncs and the testing helpers (a CUDA device is
  // opened at first use).
  detail::Device& device_of() {
    if (!device) {
      KeepCurrentDevice keep;
      device = detail::make_cuda_device(ordinal);
    }
    return *device;
  }
  ~EngineHolder() {
    engine.reset();  // waits for every transfer
    if (default_stream != nullptr) device->destroy_stream(default_stream);
  }
};

class PyTransfer {
 public:
  PyTransfer(Transfer t, std::function<Error(const Error&)> remap)
      : t_(std::move(t)), remap_(std::move(remap)) {}

  bool done() const { return t_.done(); }

  // True once done; False when `timeout` (seconds) passed first. Raises the transfer's error.
  bool wait(std::optional<double> timeout) {
    {
      py::gil_scoped_release nogil;
      if (timeout) {
        const auto deadline = std::chrono::steady_clock::now() +
                              std::chrono::duration<double>(std::max(0.0, *timeout));
        auto pause = std::chrono::microseconds(5);
        while (!t_.done()) {
          if (std::chrono::steady_clock::now() >= deadline) return false;
          std::this_thread::sleep_for(pause);
          pause = std::min(pause * 2, std::chrono::microseconds(1000));
        }
      }
      std::exception_ptr e = t_.error();
      if (e) rethrow(e);
    }
    return true;
  }

  py::object error() {
    std::exception_ptr e;
    {
      py::gil_scoped_release nogil;
      e = t_.error();
    }
    if (!e) return py::none();
    try {
      rethrow(e);
    } catch (const Error& err) {
      return make_error(err);
    } catch (...) {
      return error_object(std::current_exception());
    }
  }

  std::uint64_t bytes() const { return t_.bytes(); }

  py::list keep;  // DLPack owners and buffers read by the transfer (dropped once it is done)

 private:
  [[noreturn]] void rethrow(const std::exception_ptr& e) const {
    if (!remap_) std::rethrow_exception(e);
    try {
      std::rethrow_exception(e);
    } catch (const Error& err) {
      throw remap_(err);
    }
  }
  Transfer t_;
  std::function<Error(const Error&)> remap_;
};


// ---------------------------------------------------------------------------------------------
// Cache sets (caches.cpp).

// Names of the tensors of a list argument, as (prefix, count) runs: ("src", 0) is one tensor
// named "src"; ("dst_k_layers", 32) the tensors "dst_k_layers[0]" ... "dst_k_layers[31]".
using Names = std::vector<std::pair<std::string, std::size_t>>;

// A CacheSet made from tensors: which way its pairs go when used by swap_blocks (the first list
// is the host side: host to device), and, for a set the caller holds (Engine.register_caches),
// the tensors it describes, kept alive with it.
struct PyCacheSet {
  CacheSet set;
  bool first_is_host = true;
  std::size_t pairs = 0;
  py::list keep;
};

// swap_blocks' and transfer_kv_all_layers' sets, by the identity, data pointer and size in bytes
// of their tensors (torch tensors: cheap to read), so that a runtime calling with the same lists
// each time pays the registration once. Holds weak references only: a cached set never keeps
// a runtime's tensors alive. Small: a runtime has one set of caches per engine.
class SetCache {
 public:
  std::shared_ptr<PyCacheSet> find(const py::sequence& a, const py::sequence& b, const std::string& fn);
  void add(const py::sequence& a, const py::sequence& b, const std::string& fn, std::shared_ptr<PyCacheSet> set);
  std::size_t size() const { return entries_.size(); }
  void clear() { entries_.clear(); }

 private:
  struct Entry {
    std::string fn;
    std::vector<py::object> refs;  // weak references to the tensors, a's then b's
    std::vector<std::uintptr_t> ptrs;
    std::vector<std::uint64_t> sizes;  // nbytes
    std::shared_ptr<PyCacheSet> set;
  };
  // The key of one tensor; false when it cannot be cached (not a weakly referable torch tensor).
  static bool key_of(py::handle t, std::uintptr_t& ptr, std::uint64_t& bytes);
  static constexpr std::size_t kEntries = 8;
  std::vector<Entry> entries_;  // most recently used last
};

// Describes `firsts[i]` and `seconds[i]` (one host tensor and one device tensor of this engine's
// GPU, either way round, all pairs the same way) as one CacheSet. `host_first`: the first list
// must be the host side (Engine.register_caches). Throws gfd::Error naming the tensor.
std::shared_ptr<PyCacheSet> register_tensors(EngineHolder& h, const py::sequence& firsts,
                                             const py::sequence& seconds, const std::string& fn,
                                             const Names& first_names, const Names& second_names,
                                             bool host_first, std::optional<detail::StreamHandle> stream);

// One transfer on `set`: block ids from `mapping` ([N, 2]: source, destination) or from
// `src_ids` and `dst_ids`; host to device with `to_device`.
std::unique_ptr<PyTransfer> copy_on_set(EngineHolder& h, const PyCacheSet& set, bool to_device,
                                        py::handle mapping, py::handle src_ids, py::handle dst_ids,
                                        detail::StreamHandle stream, const std::string& fn);

}  // namespace gfd::python
