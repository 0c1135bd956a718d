// What the Python module's files share (python/src): gfd.Error, engine options and stats as
// Python dicts, element types (convert.cpp), tensors and integer arrays coming in from Python
// (arrays.cpp); gfd_ext.cpp builds the module (engines, transfers) on them.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dlpack.hpp"
#include "gfd/gfd.hpp"

namespace py = pybind11;

namespace gfd::python {

// ---------------------------------------------------------------------------------------------
// Errors: one Python exception class, gfd.Error(RuntimeError), with .code and .block.

// Creates gfd.Error in `m` and translates gfd::Error into it.
void register_error_type(py::module_& m);
// Throws gfd::Error(kInvalidArgument) with `message` (raised in Python as gfd.Error).
[[noreturn]] void bad_argument(const std::string& message);
// The gfd.Error instance for `e`.
py::object make_error(const Error& e);
// The Python exception for a stored failure (Transfer.error()).
py::object error_object(const std::exception_ptr& p);
// The name of v's type, for messages.
std::string type_name(py::handle v);

// ---------------------------------------------------------------------------------------------
// Options and stats, by field name.

// `o` with the options named in `kwargs` set (a TypeError for an unknown name, gfd.Error for a
// bad value, naming the option).
EngineOptions options_from(EngineOptions o, const py::dict& kwargs);
py::dict options_dict(const EngineOptions& o);
py::dict stats_dict(const EngineStats& s);
std::vector<std::string> option_names();
std::vector<std::string> stats_names();

// ---------------------------------------------------------------------------------------------
// Element types, by the names torch and numpy use.

struct DType {
  const char* name;
  dlpack::DataType dl;
  const char* typestr;  // numpy __array_interface__ ("|V2": no numpy equivalent)
};

// The type named `name` (gfd.Error listing the known names otherwise).
const DType& dtype_named(const std::string& name);
std::vector<std::string> dtype_names();
bool same_type(dlpack::DataType a, dlpack::DataType b);
std::string dtype_text(dlpack::DataType t);
// Bytes per element (gfd.Error naming `name` for a type that is not whole bytes).
std::size_t item_bytes(dlpack::DataType t, const std::string& name);

// ---------------------------------------------------------------------------------------------
// Tensors in: DLPack (torch, numpy, JAX, CuPy, ...), the CUDA array interface (Numba, CuPy, ...)
// or the array interface (numpy-like host arrays).

struct TensorView {
  std::byte* data = nullptr;
  int device_type = dlpack::kCPU;
  int device_id = -1;  // -1: unknown (the CUDA array interface does not say)
  dlpack::DataType dtype{dlpack::kUInt, 8, 1};
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;  // in elements, always filled
  py::object owner;                   // keeps the exported view valid
  bool host() const { return device_type == dlpack::kCPU || device_type == dlpack::kCUDAHost; }
  bool cuda() const { return device_type == dlpack::kCUDA; }
};

// Any tensor or array. `stream`: the stream the transfer runs on (device tensors are made ready
// on it). `sync_to`: makes `stream` wait for a producer stream named by the CUDA array interface.
TensorView tensor_view(py::handle obj, const std::string& name, std::optional<std::uintptr_t> stream,
                       const std::function<void(std::uintptr_t)>& sync_to);
// "cpu", "cuda:0", ... for messages.
std::string device_text(const TensorView& v);

// ---------------------------------------------------------------------------------------------
// Integer arrays in (pointers, sizes, block ids): numpy and other buffers, DLPack (torch CPU
// tensors), the array interface, or Python sequences. Values are read in place where possible.

struct IntArray {
  const std::byte* data = nullptr;
  int ndim = 1;
  std::int64_t shape[2] = {0, 1};
  std::int64_t strides[2] = {0, 0};  // bytes
  int itemsize = 8;
  bool is_signed = false;
  bool scalar = false;  // a single int, broadcast
  std::vector<std::uint64_t> storage;
  py::object owner;
  std::shared_ptr<Py_buffer> buffer;

  std::size_t rows() const { return scalar ? 0 : static_cast<std::size_t>(shape[0]); }
  // Element (i, j) as an unsigned value; false when it is negative.
  bool get(std::size_t i, std::size_t j, std::uint64_t& out) const {
    const std::byte* p = data + static_cast<std::int64_t>(i) * strides[0] + static_cast<std::int64_t>(j) * strides[1];
    std::int64_t s = 0;
    switch (itemsize) {
      case 1: if (is_signed) s = *reinterpret_cast<const std::int8_t*>(p); else { out = *reinterpret_cast<const std::uint8_t*>(p); return true; } break;
      case 2: if (is_signed) s = *reinterpret_cast<const std::int16_t*>(p); else { out = *reinterpret_cast<const std::uint16_t*>(p); return true; } break;
      case 4: if (is_signed) s = *reinterpret_cast<const std::int32_t*>(p); else { out = *reinterpret_cast<const std::uint32_t*>(p); return true; } break;
      default:
        if (is_signed) { std::memcpy(&s, p, 8); } else { std::memcpy(&out, p, 8); return true; }
    }
    if (s < 0) return false;
    out = static_cast<std::uint64_t>(s);
    return true;
  }
};

// Whether `obj` is a torch.Tensor (false while torch is not loaded).
bool is_torch_tensor(py::handle obj);
// `obj` as a 1-D or 2-D integer array (`allow_scalar`: a single int, broadcast).
IntArray int_array(py::handle obj, const std::string& name, bool allow_scalar);

}  // namespace gfd::python
