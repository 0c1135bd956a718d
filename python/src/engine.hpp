// gfd.Engine: one gfd::Engine, its device's ordinal and how a call finds its stream. The testing
// hooks (testing.cpp) make engines on the emulated device through the second constructor.
#pragma once

#include <cuda_runtime_api.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "gfd/gfd.hpp"

namespace py = pybind11;

namespace gfd::python {

class PyEngine {
 public:
  // gfd.Engine(device, **options), or Engine.from_env (the GFD_* variables first; device None:
  // GFD_DEVICE, else 0).
  PyEngine(py::handle device, const py::dict& options, bool from_env);
  // An engine the testing hooks made: `engine`'s deleter releases what they made with it (after
  // the engine); `default_stream` stands in for stream=None; `device` is theirs.
  PyEngine(std::shared_ptr<Engine> engine, int ordinal, bool emulated, cudaStream_t default_stream,
           std::shared_ptr<void> device);
  // Closes the engine (its transfers waited for with the GIL released).
  ~PyEngine();
  PyEngine(const PyEngine&) = delete;
  PyEngine& operator=(const PyEngine&) = delete;

  // The engine; gfd.Error (shutdown) once closed. A call holds it while it runs, so that close()
  // from another thread frees it only after the call.
  std::shared_ptr<Engine> engine() const;
  void close();
  bool closed() const { return !engine_; }
  int device() const { return ordinal_; }
  bool emulated() const { return emulated_; }

  // The stream a call named `fn` is ordered on: None (torch's current stream of the engine's GPU
  // once torch has used CUDA, else the default stream), an int handle, a torch.cuda.Stream or an
  // object with __cuda_stream__.
  cudaStream_t stream_of(py::handle stream, const std::string& fn) const;

  // copy_to_device / copy_to_host with three integer arrays.
  py::object copy(Direction dir, py::handle src, py::handle dst, py::handle sizes,
                  py::handle stream);

  // What the testing hooks attached: their device (opened at first use for a CUDA engine).
  std::shared_ptr<void>& testing_device() { return testing_device_; }

 private:
  std::shared_ptr<Engine> engine_;
  int ordinal_ = 0;
  bool emulated_ = false;
  cudaStream_t default_stream_ =
      nullptr;  // stream=None without torch: CUDA's default stream, or the emulated one's
  std::shared_ptr<void> testing_device_;
};

// Closes every engine still open (at exit, while the CUDA runtime is still there).
void close_all_engines();

// gfd._gfd.Engine; returns the class for the testing hooks.
py::class_<PyEngine> register_engine(py::module_& m);

}  // namespace gfd::python
