// What the Python module's files share (python/src): gfd.Error (errors.cpp), integers and
// element types (convert.cpp), engine options and stats as Python dicts (options.cpp), tensors
// (tensors.cpp) and integer arrays (arrays.cpp) coming in from Python. The classes are built on
// them, one file each: engine.cpp, transfer.cpp, cache_set.cpp, host_pool.cpp (and Buffer,
// buffer.cpp), testing.cpp; module.cpp makes the module.
#pragma once

#include <cuda_runtime_api.h>
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

// The caller's CUDA device is left as it was: opening a device makes it current, and torch's
// idea of the current device must not change under a runtime.
struct KeepCurrentDevice {
  int previous = -1;
  bool had = false;
  KeepCurrentDevice() { had = cudaGetDevice(&previous) == cudaSuccess; }
  ~KeepCurrentDevice() {
    if (had) (void)cudaSetDevice(previous);
  }
  KeepCurrentDevice(const KeepCurrentDevice&) = delete;
  KeepCurrentDevice& operator=(const KeepCurrentDevice&) = delete;
};

// ---------------------------------------------------------------------------------------------
// Errors: gfd.Error(RuntimeError) with .code and .block; gfd.InvalidArgument(gfd.Error,
// ValueError) for a bad argument (code 'invalid_argument'); gfd.InvalidType(gfd.InvalidArgument,
// TypeError) for an argument of the wrong type. Every exception the package raises is one of them.

// An argument of the wrong Python type (raised in Python as gfd.InvalidType).
class TypeArgError : public Error {
 public:
  explicit TypeArgError(const std::string& message) : Error(ErrorCode::kInvalidArgument, message) {}
};

// Creates the error classes in `m` and translates gfd::Error (and pybind11's cast errors) into
// them.
void register_error_type(py::module_& m);
// Throws gfd::Error(kInvalidArgument) with `message` (raised in Python as gfd.InvalidArgument).
[[noreturn]] void bad_argument(const std::string& message, std::uint64_t block = kNoBlock);
// Throws TypeArgError (raised in Python as gfd.InvalidType).
[[noreturn]] void bad_type(const std::string& message);
// The gfd.Error instance for `e`.
py::object make_error(const Error& e);
// The Python exception for a stored failure (Transfer.error()).
py::object error_object(const std::exception_ptr& p);
// Whether `v` is a Python bool or a numpy bool.
bool bool_like(py::handle v);
// The name of v's type, for messages ("NoneType", "float", "numpy.ndarray").
std::string type_name(py::handle v);

// ---------------------------------------------------------------------------------------------
// Integers in: the one conversion of every integer argument (ids, sizes, counts, shapes, offsets,
// pointers, stream handles). Accepted: Python int (not bool), numpy and torch integer scalars and
// arrays; bool and float rejected, also inside lists. Values are range-checked before any
// arithmetic, and messages name the argument ("copy_blocks: src_ids[3]: ...").

// An integer value as read: its sign and magnitude (Python ints beyond 64 bits are `huge`).
struct IntValue {
  bool negative = false;
  bool huge = false;  // |value| >= 2**64
  std::uint64_t magnitude = 0;
  std::string text() const;  // the value in decimal (for messages)
};

// Whether `v` is an integer as gfd takes it: a Python int that is not a bool, or a numpy or torch
// integer scalar.
bool integer_like(py::handle v);
// `v` read as an integer, or a TypeArgError naming `name`.
IntValue int_value(py::handle v, const std::string& name);
// `v` as an integer in [lo, hi] (gfd.Error naming `name` otherwise).
std::int64_t int_arg(py::handle v, const std::string& name, std::int64_t lo, std::int64_t hi);
// `v` as an integer in [0, hi].
std::uint64_t uint_arg(py::handle v, const std::string& name, std::uint64_t hi = UINT64_MAX);
// The address range a host pointer may lie in: [lowest, end) (the first pages, which the
// system never maps, and the kernel's half of the address space are outside it).
std::uintptr_t host_address_lowest();
std::uintptr_t host_address_end();
// Checks that [p, p + bytes) lies in the user address space; `name` for the message.
void check_host_range(std::uint64_t p, std::uint64_t bytes, const std::string& name,
                      std::uint64_t block);

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

// The type named `name` (gfd.Error naming `what` and listing the known names otherwise).
const DType& dtype_named(const std::string& name, const std::string& what = "dtype");
// The type `dtype` names: a name ('float16'), a torch or numpy dtype, or a numpy scalar type or
// Python's float, int or bool (gfd.Error naming `what` otherwise).
const DType& dtype_arg(py::handle dtype, const std::string& what);
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
TensorView tensor_view(py::handle obj, const std::string& name,
                       std::optional<std::uintptr_t> stream,
                       const std::function<void(std::uintptr_t)>& sync_to);
// "cpu", "cuda:0", ... for messages.
std::string device_text(const TensorView& v);

// ---------------------------------------------------------------------------------------------
// Integer arrays in (pointers, sizes, block ids): numpy and other buffers, DLPack (torch CPU
// tensors), the array interface, or Python sequences. Values are read in place where possible.

struct IntArray {
  std::string name;  // "copy_blocks: src_ids", for messages
  const std::byte* data = nullptr;
  int ndim = 1;
  std::int64_t shape[2] = {0, 1};
  std::int64_t strides[2] = {0, 0};  // bytes
  int itemsize = 8;
  bool is_signed = false;
  bool scalar = false;                 // a single int, broadcast
  std::vector<std::uint64_t> storage;  // sequences and scalars: the values, all >= 0
  py::object owner;
  std::shared_ptr<Py_buffer> buffer;

  std::size_t rows() const { return scalar ? 0 : static_cast<std::size_t>(shape[0]); }
  // Element (i, j) as stored: false when it is negative (`out` then holds the two's complement).
  bool raw(std::size_t i, std::size_t j, std::uint64_t& out) const {
    const std::byte* p = data + static_cast<std::int64_t>(i) * strides[0] +
                         static_cast<std::int64_t>(j) * strides[1];
    std::int64_t s = 0;
    switch (itemsize) {
      case 1:
        if (is_signed)
          s = *reinterpret_cast<const std::int8_t*>(p);
        else {
          out = *reinterpret_cast<const std::uint8_t*>(p);
          return true;
        }
        break;
      case 2:
        if (is_signed)
          s = *reinterpret_cast<const std::int16_t*>(p);
        else {
          out = *reinterpret_cast<const std::uint16_t*>(p);
          return true;
        }
        break;
      case 4:
        if (is_signed)
          s = *reinterpret_cast<const std::int32_t*>(p);
        else {
          out = *reinterpret_cast<const std::uint32_t*>(p);
          return true;
        }
        break;
      default:
        if (is_signed) {
          std::memcpy(&s, p, 8);
        } else {
          std::memcpy(&out, p, 8);
          return true;
        }
    }
    out = static_cast<std::uint64_t>(s);
    return s >= 0;
  }
  // "name[i]" or "name[i][j]" (a scalar: "name").
  std::string element(std::size_t i, std::size_t j) const;
  // Element (i, j) checked to be in [0, max]; gfd.Error naming it (block = i) otherwise.
  // `limit` says what bounds it, for the message ("the device caches have 8 blocks").
  std::uint64_t at(std::size_t i, std::size_t j, std::uint64_t max,
                   const std::string& limit = {}) const;
};

// Whether `obj` is a torch.Tensor (false while torch is not loaded).
bool is_torch_tensor(py::handle obj);
// `obj` as a 1-D or 2-D integer array named `name` (`allow_scalar`: a single int, broadcast).
// Rejects bool and float element types, also inside sequences, and negative or too large
// values in sequences (read as they are converted); values of arrays are checked by `at`.
// `signed_values`: a sequence's values are kept as int64, negative ones too (block ids, which
// the engine checks itself); only values beyond int64 are rejected here.
IntArray int_array(py::handle obj, const std::string& name, bool allow_scalar,
                   bool signed_values = false);
// A 1-D `a` as the engine reads block ids: int32 and int64 arrays in place, anything else
// widened into `copy` (a value beyond int64 rejected, naming it).
BlockIds block_ids(const IntArray& a, std::vector<std::int64_t>& copy);

}  // namespace gfd::python
