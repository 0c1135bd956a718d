// The Python module's engine, transfer and cache-set classes (gfd_ext.cpp builds the module on
// them; caches.cpp has the cache-set calls; testing.cpp the gfd.testing hooks). Built on the
// public C++ API (gfd::Engine, gfd::CacheSet, gfd::HostPool); only testing.cpp reaches the
// library's internals.
#pragma once

#include <pybind11/pybind11.h>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

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

// An engine and what the testing hooks attach to it (gfd.testing: the emulated device and the
// stream that stands in for the default stream there).
struct EngineHolder {
  std::optional<Engine> engine;
  int ordinal = 0;
  bool emulated = false;
  cudaStream_t default_stream = nullptr;  // stream=None: CUDA's default stream, or the emulated one's
  std::shared_ptr<void> device;           // the testing hooks' device (type known to testing.cpp only)
  std::function<void()> on_close;         // releases what the testing hooks made (after the engine)
  ~EngineHolder() {
    engine.reset();  // waits for every transfer
    if (on_close) on_close();
  }
};

class PyTransfer {
 public:
  explicit PyTransfer(Transfer t) : t_(std::move(t)) {}

  bool done() const { return t_.done(); }

  // True once done; False when `timeout` (seconds) passed first. Raises the transfer's error.
  bool wait(std::optional<double> timeout) {
    {
      py::gil_scoped_release nogil;
      if (timeout) {
        const double limit = std::min(std::max(0.0, *timeout), 1e9);  // NaN and inf: no deadline overflow
        const auto deadline = std::chrono::steady_clock::now() +
                              std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                  std::chrono::duration<double>(limit == limit ? limit : 0.0));
        auto pause = std::chrono::microseconds(5);
        while (!t_.done()) {
          if (std::chrono::steady_clock::now() >= deadline) return false;
          std::this_thread::sleep_for(pause);
          pause = std::min(pause * 2, std::chrono::microseconds(1000));
        }
      }
      std::exception_ptr e = t_.error();
      if (e) std::rethrow_exception(e);
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
    return error_object(e);
  }

  std::uint64_t bytes() const { return t_.bytes(); }

  py::list keep;  // DLPack owners and buffers read by the transfer (dropped once it is done)

 private:
  Transfer t_;
};

// Names of the tensors of a list argument, as (prefix, count) runs: ("host", 0) is one tensor
// named "host"; ("host", 32) the tensors "host[0]" ... "host[31]".
using Names = std::vector<std::pair<std::string, std::size_t>>;

// Caches registered from Python (Engine.register_caches): the set and the tensors it describes,
// kept alive with it.
struct PyCacheSet {
  CacheSet set;
  std::size_t pairs = 0;
  const void* engine = nullptr;  // the EngineHolder it was made by
  py::list keep;
};

class PyEngine {
 public:
  // device: None = GFD_DEVICE / 0 (with from_env), else 0.
  PyEngine(py::handle device, const py::dict& kwargs, bool from_env);
  // An engine made by the testing hooks.
  explicit PyEngine(std::shared_ptr<EngineHolder> h) : holder_(std::move(h)) {}

  std::shared_ptr<EngineHolder> holder() const {
    if (!holder_) throw Error(ErrorCode::kShutdown, "Engine: the engine is closed");
    return holder_;
  }
  void close();
  bool closed() const { return !holder_; }
  bool emulated() const { return holder()->emulated; }
  int device() const { return holder()->ordinal; }
  py::dict options() const;
  py::dict stats() const;

  // The stream a call is ordered on: `stream` (an int handle, checked) or the default one.
  cudaStream_t stream_of(const EngineHolder& h, py::handle stream, const std::string& fn) const;

  // copy_to_device / copy_to_host with three integer arrays.
  std::unique_ptr<PyTransfer> copy(Direction dir, py::handle src, py::handle dst, py::handle sizes,
                                   py::handle stream);
  // Engine.register_caches(host, device).
  std::shared_ptr<PyCacheSet> register_caches(py::handle host, py::handle device, const Names& host_names,
                                              const Names& device_names);
  // Engine.copy_blocks(caches, direction, src_ids, dst_ids, stream).
  std::unique_ptr<PyTransfer> copy_blocks(const PyCacheSet& set, Direction dir, py::handle src_ids,
                                          py::handle dst_ids, py::handle stream);
  // Engine.copy_blocks([caches, ...], direction, src_ids, dst_ids, stream, after_each).
  py::list copy_blocks_sets(const std::vector<std::shared_ptr<PyCacheSet>>& sets, Direction dir, py::handle src_ids,
                            py::handle dst_ids, py::handle stream, py::handle after_each);

 private:
  std::shared_ptr<EngineHolder> holder_;
};

// "to_device" / "to_host", gfd.Direction or its value: the direction named by `v`.
Direction direction_arg(py::handle v, const std::string& name);

// Describes `host[i]` and `device[i]` (one host tensor and one device tensor of this engine's
// GPU each) as one CacheSet. Throws gfd::Error naming the tensor.
std::shared_ptr<PyCacheSet> register_tensors(EngineHolder& h, const py::sequence& host, const py::sequence& device,
                                             const Names& host_names, const Names& device_names);

// One transfer on `set`: block src_ids[i] to block dst_ids[i] of every pair.
std::unique_ptr<PyTransfer> copy_on_set(EngineHolder& h, const PyCacheSet& set, Direction dir, py::handle src_ids,
                                        py::handle dst_ids, cudaStream_t stream);

// One transfer per set of `sets`, issued in order on `stream` (Engine::copy_blocks over sets),
// `after_each(k)` called (GIL held) once set k's is enqueued. Returns the transfers.
py::list copy_on_sets(EngineHolder& h, const std::vector<std::shared_ptr<PyCacheSet>>& sets, Direction dir,
                      py::handle src_ids, py::handle dst_ids, cudaStream_t stream, py::handle after_each);

// The testing submodule (testing.cpp).
void register_testing(py::module_& m, py::class_<PyEngine>& engine_class);

}  // namespace gfd::python
