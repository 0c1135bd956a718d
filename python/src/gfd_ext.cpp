// gfd's Python module (gfd._gfd): engines, transfers, tensors in through DLPack or the CUDA array
// interface, pinned host pools out through DLPack. The Python package (python/gfd/__init__.py)
// wraps these in the public classes; it resolves streams (torch's current stream) and keeps the
// Python objects of a transfer alive until it is done.
//
// Threading: every call that may block or take long (engine creation and shutdown, planning and
// gathering, waiting, pinning a pool) runs with the GIL released. Python objects are only touched
// with the GIL held.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "device.hpp"
#include "dlpack.hpp"
#include "emulated_device.hpp"
#include "engine_core.hpp"
#include "gfd/gfd.hpp"
#include "host_pool.hpp"

namespace py = pybind11;

namespace gfd::python {
namespace {

// ---------------------------------------------------------------------------------------------
// Errors: one Python exception class, gfd.Error(RuntimeError), with .code and .block.

PyObject* g_error_type = nullptr;

[[noreturn]] void bad_argument(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, message);
}

py::object make_error(const Error& e) {
  py::object type = py::reinterpret_borrow<py::object>(g_error_type);
  py::object exc = type(py::str(e.what()));
  exc.attr("code") = py::str(to_string(e.code()));
  exc.attr("block") = e.block() == kNoBlock ? py::none() : py::object(py::int_(e.block()));
  return exc;
}

// The Python exception for a stored failure (Transfer.error()).
py::object error_object(const std::exception_ptr& p) {
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    return make_error(e);
  } catch (const std::exception& e) {
    return py::reinterpret_borrow<py::object>(PyExc_RuntimeError)(py::str(e.what()));
  }
}

// ---------------------------------------------------------------------------------------------
// Options and stats: one table per struct, checked against the struct's field count at compile
// time, so that a new EngineOptions or EngineStats field cannot be forgotten here.

// The number of fields of an aggregate: the most initializers `T{...}` accepts.
struct AnyField {
  template <class T>
  operator T() const;  // never defined: used in unevaluated contexts only
};
template <class T, class... A>
consteval std::size_t count_fields() {
  if constexpr (requires { T{A{}..., AnyField{}}; })
    return count_fields<T, A..., AnyField>();
  else
    return sizeof...(A);
}

std::string type_name(py::handle v) { return py::str(py::type::of(v).attr("__name__")); }

// "64M", "2G", "4096" (sizes as the GFD_* variables take them).
std::size_t parse_size(const std::string& text, const char* name) {
  std::size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &pos);
  } catch (...) {
    bad_argument(std::string("Engine: option '") + name + "': '" + text + "' is not a size");
  }
  std::string unit = text.substr(pos);
  if (unit == "K" || unit == "k" || unit == "KiB") v <<= 10;
  else if (unit == "M" || unit == "m" || unit == "MiB") v <<= 20;
  else if (unit == "G" || unit == "g" || unit == "GiB") v <<= 30;
  else if (!unit.empty())
    bad_argument(std::string("Engine: option '") + name + "': '" + text +
                 "' is not a size (a number with an optional K, M or G suffix)");
  return static_cast<std::size_t>(v);
}

void assign(std::size_t& out, py::handle v, const char* name) {
  if (py::isinstance<py::str>(v)) {
    out = parse_size(v.cast<std::string>(), name);
    return;
  }
  if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v))
    throw py::type_error(std::string("Engine: option '") + name +
                         "' takes a size in bytes (int, or str like '64M'), not " + type_name(v));
  if (PyLong_AsLongLong(v.ptr()) < 0 && !PyErr_Occurred())
    bad_argument(std::string("Engine: option '") + name + "': " + std::string(py::str(v)) +
                 " is negative");
  PyErr_Clear();
  out = v.cast<std::size_t>();
}
void assign(int& out, py::handle v, const char* name) {
  if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v))
    throw py::type_error(std::string("Engine: option '") + name + "' takes an int, not " + type_name(v));
  out = v.cast<int>();
}
void assign(bool& out, py::handle v, const char* name) {
  if (!py::isinstance<py::bool_>(v) && !py::isinstance<py::int_>(v))
    throw py::type_error(std::string("Engine: option '") + name + "' takes a bool, not " + type_name(v));
  out = py::cast<bool>(py::bool_(py::reinterpret_borrow<py::object>(v)));
}
void assign(Backend& out, py::handle v, const char* name) {
  if (!py::isinstance<py::str>(v))
    throw py::type_error(std::string("Engine: option '") + name +
                         "' takes a backend name (str, e.g. 'gather'), not " + type_name(v));
  out = backend_from_string(v.cast<std::string>());
}
void assign(StagingWrites& out, py::handle v, const char* name) {
  if (!py::isinstance<py::str>(v))
    throw py::type_error(std::string("Engine: option '") + name +
                         "' takes a mode name (str, e.g. 'auto'), not " + type_name(v));
  out = staging_writes_from_string(v.cast<std::string>());
}

template <class T>
py::object to_py(const T& v) {
  if constexpr (std::is_enum_v<T>) return py::str(to_string(v));
  else return py::cast(v);
}

struct OptionField {
  const char* name;
  void (*set)(EngineOptions&, py::handle);
  py::object (*get)(const EngineOptions&);
};

// Every EngineOptions field, in declaration order. A new field: add one line.
#define GFD_OPTION(f)                                                          \
  OptionField {                                                                \
    #f, [](EngineOptions& o, py::handle v) { assign(o.f, v, #f); },            \
        [](const EngineOptions& o) -> py::object { return to_py(o.f); }        \
  }
const OptionField kOptionFields[] = {
    GFD_OPTION(device),
    GFD_OPTION(staging_bytes),
    GFD_OPTION(slot_bytes),
    GFD_OPTION(first_chunk_bytes),
    GFD_OPTION(piece_bytes),
    GFD_OPTION(direct_min_bytes),
    GFD_OPTION(inline_gather_bytes),
    GFD_OPTION(gather_threads),
    GFD_OPTION(copy_streams),
    GFD_OPTION(numa_node),
    GFD_OPTION(use_all_local_cpus),
    GFD_OPTION(spin_us),
    GFD_OPTION(submitter_gathers),
    GFD_OPTION(staging_writes),
    GFD_OPTION(preissue),
    GFD_OPTION(kernel_max_bytes),
    GFD_OPTION(pageable_cache_ms),
    GFD_OPTION(check_overlaps),
    GFD_OPTION(backend),
};
#undef GFD_OPTION
static_assert(std::size(kOptionFields) == count_fields<EngineOptions>(),
              "EngineOptions has a field that kOptionFields (python/src/gfd_ext.cpp) lacks");

struct StatsField {
  const char* name;
  py::object (*get)(const EngineStats&);
};
#define GFD_STAT(f) StatsField{#f, [](const EngineStats& s) -> py::object { return to_py(s.f); }}
const StatsField kStatsFields[] = {
    GFD_STAT(bytes),          GFD_STAT(transfers),       GFD_STAT(blocks),
    GFD_STAT(chunks),         GFD_STAT(scattered_chunks), GFD_STAT(direct_copies),
    GFD_STAT(gather_seconds), GFD_STAT(dma_seconds),     GFD_STAT(submit_wait_seconds),
    GFD_STAT(plan_seconds),   GFD_STAT(hugepages),       GFD_STAT(numa_node),
    GFD_STAT(gather_threads), GFD_STAT(staging_bytes),   GFD_STAT(slot_bytes),
    GFD_STAT(cpus),           GFD_STAT(cpu_sharing),     GFD_STAT(staging_writes),
};
#undef GFD_STAT
static_assert(std::size(kStatsFields) == count_fields<EngineStats>(),
              "EngineStats has a field that kStatsFields (python/src/gfd_ext.cpp) lacks");

EngineOptions options_from(EngineOptions o, const py::dict& kwargs) {
  for (auto [key, value] : kwargs) {
    const std::string k = py::str(key);
    const OptionField* f = nullptr;
    for (const OptionField& c : kOptionFields)
      if (k == c.name) f = &c;
    if (f == nullptr) {
      std::string known;
      for (const OptionField& c : kOptionFields) known += (known.empty() ? "" : ", ") + std::string(c.name);
      throw py::type_error("Engine: unknown option '" + k + "' (options: " + known + ")");
    }
    f->set(o, value);
  }
  return o;
}

py::dict options_dict(const EngineOptions& o) {
  py::dict d;
  for (const OptionField& f : kOptionFields) d[f.name] = f.get(o);
  return d;
}

// ---------------------------------------------------------------------------------------------
// Element types, by the names torch and numpy use.

struct DType {
  const char* name;
  dlpack::DataType dl;
  const char* typestr;  // numpy __array_interface__ ("|V2": no numpy equivalent)
};
const DType kDTypes[] = {
    {"bool", {dlpack::kBool, 8, 1}, "|b1"},
    {"int8", {dlpack::kInt, 8, 1}, "|i1"},
    {"int16", {dlpack::kInt, 16, 1}, "<i2"},
    {"int32", {dlpack::kInt, 32, 1}, "<i4"},
    {"int64", {dlpack::kInt, 64, 1}, "<i8"},
    {"uint8", {dlpack::kUInt, 8, 1}, "|u1"},
    {"uint16", {dlpack::kUInt, 16, 1}, "<u2"},
    {"uint32", {dlpack::kUInt, 32, 1}, "<u4"},
    {"uint64", {dlpack::kUInt, 64, 1}, "<u8"},
    {"float16", {dlpack::kFloat, 16, 1}, "<f2"},
    {"float32", {dlpack::kFloat, 32, 1}, "<f4"},
    {"float64", {dlpack::kFloat, 64, 1}, "<f8"},
    {"bfloat16", {dlpack::kBfloat, 16, 1}, "|V2"},
    {"float8_e4m3fn", {dlpack::kFloat8_e4m3fn, 8, 1}, "|V1"},
    {"float8_e5m2", {dlpack::kFloat8_e5m2, 8, 1}, "|V1"},
};

const DType& dtype_named(const std::string& name) {
  for (const DType& t : kDTypes)
    if (name == t.name) return t;
  std::string known;
  for (const DType& t : kDTypes) known += (known.empty() ? "" : ", ") + std::string(t.name);
  bad_argument("dtype: '" + name + "' is not a dtype gfd knows (" + known + ")");
}

bool same_type(dlpack::DataType a, dlpack::DataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

std::string dtype_text(dlpack::DataType t) {
  for (const DType& d : kDTypes)
    if (same_type(d.dl, t)) return d.name;
  return "dtype(code " + std::to_string(t.code) + ", " + std::to_string(t.bits) + " bits x " +
         std::to_string(t.lanes) + ")";
}

std::size_t item_bytes(dlpack::DataType t, const std::string& name) {
  if (t.bits % 8 != 0 || t.bits == 0 || t.lanes == 0)
    bad_argument(name + ": " + dtype_text(t) + " is not a whole number of bytes per element");
  return std::size_t{t.bits} / 8 * t.lanes;
}

// ---------------------------------------------------------------------------------------------
// Tensors in: DLPack (torch, numpy, JAX, CuPy, ...), the CUDA array interface (Numba, CuPy, ...)
// or the array interface (numpy-like host arrays).

// Owns a consumed DLPack tensor; its deleter runs when the last reference goes (the tensor's
// memory is kept alive by the producer until then).
struct DlpackOwner {
  dlpack::ManagedTensor* legacy = nullptr;
  dlpack::ManagedTensorVersioned* versioned = nullptr;
  ~DlpackOwner() {
    if (legacy != nullptr && legacy->deleter != nullptr) legacy->deleter(legacy);
    if (versioned != nullptr && versioned->deleter != nullptr) versioned->deleter(versioned);
  }
};

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

void compact_strides(TensorView& v) {
  v.strides.assign(v.shape.size(), 1);
  for (int i = static_cast<int>(v.shape.size()) - 2; i >= 0; --i)
    v.strides[i] = v.strides[i + 1] * std::max<std::int64_t>(v.shape[i + 1], 1);
}

void take_dltensor(TensorView& v, const dlpack::Tensor& t) {
  v.data = static_cast<std::byte*>(t.data) + t.byte_offset;
  v.device_type = t.device.device_type;
  v.device_id = t.device.device_id;
  v.dtype = t.dtype;
  v.shape.assign(t.shape, t.shape + t.ndim);
  if (t.strides != nullptr) v.strides.assign(t.strides, t.strides + t.ndim);
  else compact_strides(v);
}

// The CUDA stream a DLPack producer is told the consumer uses: 0 is ambiguous in the protocol
// (1 is the legacy default stream).
py::object dlpack_stream_arg(std::uintptr_t stream) {
  return py::int_(stream == 0 ? std::uintptr_t{1} : stream);
}

// `may_decline`: the object has another interface to fall back on; if its DLPack export itself
// fails (a read-only numpy array refuses it), return nothing instead of throwing. Anything wrong
// with what the export returned is an error either way.
std::optional<TensorView> from_dlpack(py::handle obj, const std::string& name,
                                      std::optional<std::uintptr_t> stream, bool may_decline) {
  TensorView v;
  py::tuple dev = obj.attr("__dlpack_device__")();
  const int type = dev[0].cast<int>();
  py::object capsule;
  try {
    // A device tensor is made ready on our stream by its producer (torch: our stream waits for
    // torch's current stream); host tensors take no stream.
    if ((type == dlpack::kCUDA || type == dlpack::kROCM) && stream)
      capsule = obj.attr("__dlpack__")(py::arg("stream") = dlpack_stream_arg(*stream));
    else
      capsule = obj.attr("__dlpack__")();
  } catch (py::error_already_set& e) {
    if (may_decline) return std::nullopt;
    bad_argument(name + ": exporting it through DLPack failed: " + std::string(e.what()));
  }
  PyObject* cap = capsule.ptr();
  auto owner = std::make_unique<DlpackOwner>();
  if (PyCapsule_IsValid(cap, "dltensor")) {
    owner->legacy = static_cast<dlpack::ManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
    PyCapsule_SetName(cap, "used_dltensor");
    take_dltensor(v, owner->legacy->dl_tensor);
  } else if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
    owner->versioned =
        static_cast<dlpack::ManagedTensorVersioned*>(PyCapsule_GetPointer(cap, "dltensor_versioned"));
    PyCapsule_SetName(cap, "used_dltensor_versioned");
    if (owner->versioned->version.major > 1) {
      const auto major = owner->versioned->version.major;
      bad_argument(name + ": DLPack " + std::to_string(major) + ".x is newer than gfd reads (1.x)");
    }
    take_dltensor(v, owner->versioned->dl_tensor);
  } else {
    bad_argument(name + ": __dlpack__ did not return a DLPack capsule");
  }
  v.owner = py::capsule(owner.release(), [](void* p) { delete static_cast<DlpackOwner*>(p); });
  return v;
}

// typestr as numpy writes it ("<f2", "|u1", "<V2" ...) to a DLPack type.
dlpack::DataType from_typestr(const std::string& ts, const std::string& name) {
  if (ts.size() < 3) bad_argument(name + ": typestr '" + ts + "' is malformed");
  const char kind = ts[1];
  const int bytes = std::atoi(ts.c_str() + 2);
  if (ts[0] == '>' && bytes > 1) bad_argument(name + ": big-endian data (" + ts + ") is not supported");
  const auto bits = static_cast<std::uint8_t>(bytes * 8);
  switch (kind) {
    case 'i': return {dlpack::kInt, bits, 1};
    case 'u': return {dlpack::kUInt, bits, 1};
    case 'f': return {dlpack::kFloat, bits, 1};
    case 'b': return {dlpack::kBool, bits, 1};
    case 'V': return {dlpack::kUInt, 8, static_cast<std::uint16_t>(bytes)};  // opaque bytes
    default: bad_argument(name + ": typestr '" + ts + "' is not a type gfd moves");
  }
}

void shape_from_interface(TensorView& v, const py::dict& d, const std::string& name) {
  for (py::handle s : d["shape"].cast<py::tuple>()) v.shape.push_back(s.cast<std::int64_t>());
  v.dtype = from_typestr(d["typestr"].cast<std::string>(), name);
  const std::size_t item = item_bytes(v.dtype, name);
  if (d.contains("strides") && !d["strides"].is_none()) {
    for (py::handle s : d["strides"].cast<py::tuple>()) {
      const auto b = s.cast<std::int64_t>();
      if (b % static_cast<std::int64_t>(item) != 0)
        bad_argument(name + ": a stride of " + std::to_string(b) + " bytes is not a whole element");
      v.strides.push_back(b / static_cast<std::int64_t>(item));
    }
  } else {
    compact_strides(v);
  }
  py::tuple data = d["data"].cast<py::tuple>();
  v.data = reinterpret_cast<std::byte*>(data[0].cast<std::uintptr_t>());
}

// Any tensor or array. `stream`: the stream the transfer runs on (device tensors are made ready
// on it). `sync_to`: makes `stream` wait for a producer stream named by the CUDA array interface.
TensorView tensor_view(py::handle obj, const std::string& name, std::optional<std::uintptr_t> stream,
                       const std::function<void(std::uintptr_t)>& sync_to) {
  if (py::hasattr(obj, "__dlpack__") && py::hasattr(obj, "__dlpack_device__")) {
    // A read-only numpy array refuses DLPack export; its array interface still works.
    const bool other = py::hasattr(obj, "__array_interface__") || py::hasattr(obj, "__cuda_array_interface__");
    if (std::optional<TensorView> v = from_dlpack(obj, name, stream, other)) return std::move(*v);
  }
  if (py::hasattr(obj, "__cuda_array_interface__")) {
    TensorView v;
    py::dict d = obj.attr("__cuda_array_interface__");
    shape_from_interface(v, d, name);
    v.device_type = dlpack::kCUDA;
    v.device_id = -1;  // the engine's validation checks that the memory is on its GPU
    // Version 3: the producer's stream, which the consumer must wait for.
    if (d.contains("stream") && !d["stream"].is_none() && sync_to) {
      const auto producer = d["stream"].cast<std::uintptr_t>();
      if (!stream || producer != *stream) sync_to(producer);
    }
    v.owner = py::reinterpret_borrow<py::object>(obj);
    return v;
  }
  if (py::hasattr(obj, "__array_interface__")) {
    TensorView v;
    shape_from_interface(v, obj.attr("__array_interface__"), name);
    v.device_type = dlpack::kCPU;
    v.owner = py::reinterpret_borrow<py::object>(obj);
    return v;
  }
  bad_argument(name + ": expected a tensor (an object with __dlpack__, __cuda_array_interface__ or "
                      "__array_interface__), got " + type_name(obj));
}

std::string device_text(const TensorView& v) {
  switch (v.device_type) {
    case dlpack::kCPU: return "cpu";
    case dlpack::kCUDAHost: return "cpu (pinned)";
    case dlpack::kCUDA: return v.device_id >= 0 ? "cuda:" + std::to_string(v.device_id) : "cuda";
    case dlpack::kCUDAManaged: return "cuda (managed memory)";
    default: return "device type " + std::to_string(v.device_type);
  }
}

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

void int_type(IntArray& a, dlpack::DataType t, const std::string& name) {
  if ((t.code != dlpack::kInt && t.code != dlpack::kUInt) || t.lanes != 1 ||
      (t.bits != 8 && t.bits != 16 && t.bits != 32 && t.bits != 64))
    bad_argument(name + ": dtype " + dtype_text(t) + " is not an integer type");
  a.itemsize = t.bits / 8;
  a.is_signed = t.code == dlpack::kInt;
}

void int_shape(IntArray& a, const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& strides_bytes,
               const std::string& name) {
  if (shape.empty() || shape.size() > 2)
    bad_argument(name + ": expected a 1-D or 2-D integer array, got " + std::to_string(shape.size()) + " dimensions");
  a.ndim = static_cast<int>(shape.size());
  for (int i = 0; i < a.ndim; ++i) {
    a.shape[i] = shape[i];
    a.strides[i] = strides_bytes[i];
  }
}

IntArray int_array(py::handle obj, const std::string& name, bool allow_scalar) {
  IntArray a;
  if (py::isinstance<py::int_>(obj) && !py::isinstance<py::bool_>(obj)) {
    if (!allow_scalar) bad_argument(name + ": expected an array of integers, got an int");
    const auto v = PyLong_AsLongLong(obj.ptr());
    if (v < 0 && !PyErr_Occurred()) bad_argument(name + ": " + std::to_string(v) + " is negative");
    PyErr_Clear();
    a.scalar = true;
    a.storage.push_back(obj.cast<std::uint64_t>());
    a.data = reinterpret_cast<const std::byte*>(a.storage.data());
    a.shape[0] = 1;
    return a;
  }
  // Buffers (numpy arrays, array.array): read in place.
  if (PyObject_CheckBuffer(obj.ptr())) {
    auto view = std::shared_ptr<Py_buffer>(new Py_buffer, [](Py_buffer* b) {
      PyBuffer_Release(b);
      delete b;
    });
    if (PyObject_GetBuffer(obj.ptr(), view.get(), PyBUF_STRIDES | PyBUF_FORMAT) == 0) {
      std::string fmt = view->format != nullptr ? view->format : "B";
      if (!fmt.empty() && (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@' || fmt[0] == '!' || fmt[0] == '>')) {
        if (fmt[0] == '>' || fmt[0] == '!') bad_argument(name + ": big-endian integers are not supported");
        fmt = fmt.substr(1);
      }
      const std::string ints = "bBhHiIlLqQnN";
      if (fmt.size() != 1 || ints.find(fmt[0]) == std::string::npos)
        bad_argument(name + ": buffer of format '" + fmt + "' is not an integer array");
      a.itemsize = static_cast<int>(view->itemsize);
      a.is_signed = std::islower(static_cast<unsigned char>(fmt[0])) != 0;
      std::vector<std::int64_t> shape(view->shape, view->shape + view->ndim);
      std::vector<std::int64_t> strides(view->strides, view->strides + view->ndim);
      int_shape(a, shape, strides, name);
      a.data = static_cast<const std::byte*>(view->buf);
      a.buffer = std::move(view);
      return a;
    }
    PyErr_Clear();
  }
  // DLPack (torch CPU tensors) and the array interface.
  if ((py::hasattr(obj, "__dlpack__") && py::hasattr(obj, "__dlpack_device__")) ||
      py::hasattr(obj, "__array_interface__") || py::hasattr(obj, "__cuda_array_interface__")) {
    TensorView v = tensor_view(obj, name, std::nullopt, {});
    if (!v.host())
      bad_argument(name + ": must be in host memory (a CPU array or tensor), not on " + device_text(v));
    int_type(a, v.dtype, name);
    std::vector<std::int64_t> strides(v.strides.size());
    for (std::size_t i = 0; i < strides.size(); ++i) strides[i] = v.strides[i] * a.itemsize;
    int_shape(a, v.shape, strides, name);
    a.data = v.data;
    a.owner = std::move(v.owner);
    return a;
  }
  // Sequences (lists, tuples), 1-D or of pairs.
  if (py::isinstance<py::sequence>(obj) && !py::isinstance<py::str>(obj)) {
    py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
    const std::size_t n = seq.size();
    int cols = 0;  // 0: 1-D
    a.storage.reserve(n);
    auto take = [&](py::handle x, std::size_t i, std::size_t j) {
      if (!py::isinstance<py::int_>(x) || py::isinstance<py::bool_>(x)) {
        // numpy scalars and 0-d tensors convert through __index__.
        if (!py::hasattr(x, "__index__"))
          bad_argument(name + "[" + std::to_string(i) + (cols ? "][" + std::to_string(j) : "") +
                       "]: expected an int, got " + type_name(x));
      }
      const auto big = py::reinterpret_steal<py::object>(PyNumber_Index(x.ptr()));
      if (!big) throw py::error_already_set();
      if (PyLong_AsLongLong(big.ptr()) < 0 && !PyErr_Occurred())
        bad_argument(name + "[" + std::to_string(i) + (cols ? "][" + std::to_string(j) : "") +
                     "]: " + std::string(py::str(big)) + " is negative");
      PyErr_Clear();
      a.storage.push_back(big.cast<std::uint64_t>());
    };
    for (std::size_t i = 0; i < n; ++i) {
      py::object x = seq[i];
      const bool pair = py::isinstance<py::sequence>(x) && !py::isinstance<py::str>(x);
      if (i == 0) cols = pair ? static_cast<int>(py::len(x)) : 0;
      if (pair != (cols != 0) || (pair && static_cast<int>(py::len(x)) != cols))
        bad_argument(name + "[" + std::to_string(i) + "]: rows differ in shape");
      if (pair) {
        py::sequence row = py::reinterpret_borrow<py::sequence>(x);
        for (int j = 0; j < cols; ++j) take(row[j], i, j);
      } else {
        take(x, i, 0);
      }
    }
    a.itemsize = 8;
    a.is_signed = false;
    a.data = reinterpret_cast<const std::byte*>(a.storage.data());
    a.ndim = cols ? 2 : 1;
    a.shape[0] = static_cast<std::int64_t>(n);
    a.shape[1] = cols ? cols : 1;
    a.strides[0] = 8 * std::max(cols, 1);
    a.strides[1] = 8;
    return a;
  }
  bad_argument(name + ": expected an integer array (numpy array, CPU tensor or list), got " + type_name(obj));
}

// ---------------------------------------------------------------------------------------------
// Engines.

// An engine and, for the emulated device, the stream that stands in for the default stream.
struct EngineHolder {
  std::shared_ptr<detail::Device> device;  // the emulated device, or a CUDA one for helpers
  detail::StreamHandle default_stream = nullptr;
  bool emulated = false;
  int ordinal = 0;
  std::optional<Engine> engine;
  ~EngineHolder() {
    engine.reset();  // waits for every transfer
    if (default_stream != nullptr) device->destroy_stream(default_stream);
  }
};

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

enum class Direction { kToDevice, kToHost };

class PyEngine {
 public:
  // device: nullopt = GFD_DEVICE / 0.
  PyEngine(std::optional<int> device, const py::dict& kwargs, bool from_env) {
    EngineOptions o = from_env ? EngineOptions::from_env() : EngineOptions{};
    if (device) o.device = *device;
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

  // An engine on the emulated device (testing).
  PyEngine(const py::dict& kwargs, std::uint32_t copy_delay_us, int ordinal, const std::string& fault) {
    EngineOptions o = options_from(EngineOptions{}, kwargs);
    o.device = ordinal;
    auto h = std::make_shared<EngineHolder>();
    detail::EmulatedDeviceOptions emu;
    emu.copy_delay = std::chrono::microseconds(copy_delay_us);
    if (!fault.empty()) emu.fault = [fault](const char* op) { return fault == op; };
    h->device = std::make_shared<detail::EmulatedDevice>(ordinal, emu);
    h->emulated = true;
    h->ordinal = ordinal;
    {
      py::gil_scoped_release nogil;
      h->default_stream = h->device->create_stream();
      h->engine.emplace(detail::EngineCore::make_engine(o, h->device));
    }
    holder_ = std::move(h);
  }

  std::shared_ptr<EngineHolder> holder() const {
    if (!holder_) throw Error(ErrorCode::kShutdown, "Engine: the engine is closed");
    return holder_;
  }

  void close() {
    std::shared_ptr<EngineHolder> h = std::move(holder_);
    py::gil_scoped_release nogil;
    h.reset();  // waits for the engine's transfers (unless a call in flight still holds it)
  }
  bool closed() const { return !holder_; }
  bool emulated() const { return holder()->emulated; }
  int device() const { return holder()->ordinal; }

  py::dict options() const { return options_dict(holder()->engine->options()); }
  py::dict stats() const {
    EngineStats s;
    {
      auto h = holder();
      py::gil_scoped_release nogil;
      s = h->engine->stats();
    }
    py::dict d;
    for (const StatsField& f : kStatsFields) d[f.name] = f.get(s);
    return d;
  }

  detail::StreamHandle stream_of(const EngineHolder& h, std::optional<std::uintptr_t> stream) const {
    if (stream) return reinterpret_cast<detail::StreamHandle>(*stream);
    return h.default_stream;  // nullptr (CUDA's default stream) except on the emulated device
  }

  // The device behind the engine, for the testing helpers and stream syncs.
  detail::Device& device_of(EngineHolder& h) {
    if (!h.device) {
      KeepCurrentDevice keep;
      h.device = detail::make_cuda_device(h.ordinal);
    }
    return *h.device;
  }

  // copy_to_device / copy_to_host with three integer arrays.
  std::unique_ptr<PyTransfer> copy(Direction dir, py::handle src, py::handle dst, py::handle sizes,
                                   std::optional<std::uintptr_t> stream) {
    const char* fn = dir == Direction::kToDevice ? "copy_to_device" : "copy_to_host";
    auto h = holder();
    IntArray s = int_array(src, std::string(fn) + ": src_ptrs", false);
    IntArray d = int_array(dst, std::string(fn) + ": dst_ptrs", false);
    IntArray n = int_array(sizes, std::string(fn) + ": sizes", true);
    for (auto* a : {&s, &d, &n})
      if (a->ndim != 1 && !a->scalar)
        bad_argument(std::string(fn) + ": src_ptrs, dst_ptrs and sizes must be 1-D");
    if (s.rows() != d.rows())
      bad_argument(std::string(fn) + ": src_ptrs has " + std::to_string(s.rows()) + " entries, dst_ptrs " +
                   std::to_string(d.rows()));
    if (!n.scalar && n.rows() != s.rows())
      bad_argument(std::string(fn) + ": sizes has " + std::to_string(n.rows()) + " entries, src_ptrs " +
                   std::to_string(s.rows()));
    const std::size_t count = s.rows();
    const detail::StreamHandle st = stream_of(*h, stream);
    Transfer t;
    {
      py::gil_scoped_release nogil;
      std::vector<BlockCopy> blocks(count);
      for (std::size_t i = 0; i < count; ++i) {
        std::uint64_t a = 0, b = 0, c = 0;
        if (!s.get(i, 0, a) || !d.get(i, 0, b) || !n.get(n.scalar ? 0 : i, 0, c))
          throw Error(ErrorCode::kInvalidArgument,
                      std::string(fn) + ": entry " + std::to_string(i) + " has a negative value", i);
        blocks[i] = {reinterpret_cast<const void*>(a), reinterpret_cast<void*>(b), static_cast<std::size_t>(c)};
      }
      auto cs = static_cast<cudaStream_t>(st);
      t = dir == Direction::kToDevice ? h->engine->copy_to_device(blocks, cs) : h->engine->copy_to_host(blocks, cs);
    }
    auto out = std::make_unique<PyTransfer>(std::move(t), nullptr);
    for (auto* a : {&s, &d, &n})
      if (a->owner) out->keep.append(a->owner);
    return out;
  }

  // vLLM's swap_blocks over P pairs of caches (one pair: one layer's K or V) and one mapping:
  // rows (src block, dst block) of `mapping` ([N, 2]), or src_ids / dst_ids ([N] each). One
  // transfer moves block src_id of every src cache to block dst_id of its dst cache.
  std::unique_ptr<PyTransfer> swap(const py::sequence& srcs, const py::sequence& dsts, py::handle mapping,
                                   py::handle src_ids, py::handle dst_ids, std::optional<std::uintptr_t> stream,
                                   const std::string& fn, const std::vector<std::pair<std::string, std::size_t>>& src_names,
                                   const std::vector<std::pair<std::string, std::size_t>>& dst_names) {
    auto h = holder();
    const std::size_t pairs = srcs.size();
    if (dsts.size() != pairs)
      bad_argument(fn + ": " + std::to_string(pairs) + " source caches but " + std::to_string(dsts.size()) +
                   " destination caches");
    auto name_of = [&](const std::vector<std::pair<std::string, std::size_t>>& names, std::size_t i) {
      for (const auto& [prefix, count] : names) {
        if (count == 0) return prefix;  // a single tensor
        if (i < count) return prefix + "[" + std::to_string(i) + "]";
        i -= count;
      }
      return std::string("tensor ") + std::to_string(i);
    };
    const detail::StreamHandle st = stream_of(*h, stream);
    const auto stream_value = reinterpret_cast<std::uintptr_t>(st);
    auto sync_to = [&](std::uintptr_t producer) {
      detail::Device& d = device_of(*h);
      detail::EventHandle e = d.create_event(false);
      d.record_event(e, reinterpret_cast<detail::StreamHandle>(producer));
      d.stream_wait_event(st, e);
      d.destroy_event(e);
    };

    // The mapping: one [N, 2] array, or two [N] arrays.
    IntArray map_a, map_b;
    std::size_t from_col = 0, to_col = 0;
    const IntArray* from = &map_a;
    const IntArray* to = &map_a;
    if (!mapping.is_none()) {
      map_a = int_array(mapping, fn + ": block_mapping", false);
      if (map_a.rows() > 0 && (map_a.ndim != 2 || map_a.shape[1] != 2))
        bad_argument(fn + ": block_mapping must have shape [N, 2] (src block, dst block), got " +
                     (map_a.ndim == 2 ? "[" + std::to_string(map_a.shape[0]) + ", " + std::to_string(map_a.shape[1]) + "]"
                                      : "[" + std::to_string(map_a.shape[0]) + "]"));
      to_col = 1;
    } else {
      map_a = int_array(src_ids, fn + ": src_indices", false);
      map_b = int_array(dst_ids, fn + ": dst_indices", false);
      to = &map_b;
      if (map_a.ndim != 1 || map_b.ndim != 1) bad_argument(fn + ": src_indices and dst_indices must be 1-D");
      if (map_a.rows() != map_b.rows())
        bad_argument(fn + ": src_indices has " + std::to_string(map_a.rows()) + " entries, dst_indices " +
                     std::to_string(map_b.rows()));
    }
    const std::size_t rows = from->rows();
    const std::string from_name = mapping.is_none() ? fn + ": src_indices" : fn + ": block_mapping";
    const std::string to_name = mapping.is_none() ? fn + ": dst_indices" : fn + ": block_mapping";

    // The caches.
    struct Side {
      std::byte* base;
      std::int64_t stride;  // bytes between blocks
      std::uint64_t blocks;
    };
    struct Pair {
      Side src, dst;
      std::size_t block_bytes;
    };
    std::vector<Pair> ps(pairs);
    py::list keep;
    int direction = 0;  // +1 host to device, -1 device to host
    auto side = [&](const TensorView& v, const std::string& name, std::size_t& block_bytes) {
      if (v.shape.empty()) bad_argument(fn + ": " + name + ": a cache needs a first (block) dimension; got a scalar");
      const std::size_t item = item_bytes(v.dtype, fn + ": " + name);
      // Every dimension after the first must be compact: a block is one contiguous range.
      std::int64_t expect = 1;
      for (int i = static_cast<int>(v.shape.size()) - 1; i >= 1; --i) {
        if (v.shape[i] != 1 && v.strides[i] != expect)
          bad_argument(fn + ": " + name + ": each block must be contiguous (dimensions 1.. of the cache "
                                          "compact, row-major); dimension " + std::to_string(i) + " has stride " +
                       std::to_string(v.strides[i]) + ", expected " + std::to_string(expect));
        expect *= v.shape[i];
      }
      block_bytes = static_cast<std::size_t>(expect) * item;
      if (v.shape[0] > 1 && (v.strides[0] < expect))
        bad_argument(fn + ": " + name + ": blocks overlap or run backwards (stride of dimension 0 is " +
                     std::to_string(v.strides[0]) + " elements, a block has " + std::to_string(expect) + ")");
      return Side{v.data, v.strides[0] * static_cast<std::int64_t>(item), static_cast<std::uint64_t>(v.shape[0])};
    };
    for (std::size_t p = 0; p < pairs; ++p) {
      const std::string sn = name_of(src_names, p), dn = name_of(dst_names, p);
      TensorView s = tensor_view(srcs[p], fn + ": " + sn, stream_value, sync_to);
      TensorView d = tensor_view(dsts[p], fn + ": " + dn, stream_value, sync_to);
      for (const auto* v : {&s, &d}) {
        const std::string& n = v == &s ? sn : dn;
        if (!v->host() && !v->cuda())
          bad_argument(fn + ": " + n + " is on " + device_text(*v) +
                       "; gfd moves blocks between host memory and device memory of the engine's GPU");
        if (v->cuda() && v->device_id >= 0 && v->device_id != h->ordinal)
          bad_argument(fn + ": " + n + " is on " + device_text(*v) + ", but the engine serves GPU " +
                       std::to_string(h->ordinal));
      }
      const int dir = s.host() && d.cuda() ? 1 : s.cuda() && d.host() ? -1 : 0;
      if (dir == 0)
        bad_argument(fn + ": " + sn + " is on " + device_text(s) + " and " + dn + " on " + device_text(d) +
                     "; one must be host memory and the other device memory of GPU " + std::to_string(h->ordinal));
      if (direction != 0 && dir != direction)
        bad_argument(fn + ": " + sn + " -> " + dn + " goes the other way than " + name_of(src_names, 0) + " -> " +
                     name_of(dst_names, 0) + "; one transfer moves blocks in one direction");
      direction = dir;
      if (!same_type(s.dtype, d.dtype))
        bad_argument(fn + ": " + dn + " has dtype " + dtype_text(d.dtype) + ", " + sn + " " + dtype_text(s.dtype));
      std::size_t sb = 0, db = 0;
      ps[p].src = side(s, sn, sb);
      ps[p].dst = side(d, dn, db);
      if (sb != db)
        bad_argument(fn + ": blocks of " + sn + " have " + std::to_string(sb) + " bytes, blocks of " + dn + " " +
                     std::to_string(db) + " (the shapes after the first dimension must match)");
      ps[p].block_bytes = sb;
      keep.append(s.owner);
      keep.append(d.owner);
    }
    for (const IntArray* a : {&map_a, &map_b})
      if (a->owner) keep.append(a->owner);

    // The copy list: block r of pair p is entry p * rows + r.
    auto describe = [=](std::size_t p, std::size_t r, std::uint64_t s, std::uint64_t d) {
      return fn + ": " + name_of(src_names, p) + " -> " + name_of(dst_names, p) + ", row " + std::to_string(r) +
             " (block " + std::to_string(s) + " -> " + std::to_string(d) + ")";
    };
    Transfer t;
    std::function<Error(const Error&)> remap;
    {
      py::gil_scoped_release nogil;
      std::vector<std::uint64_t> ids(2 * rows);
      for (std::size_t r = 0; r < rows; ++r) {
        if (!from->get(r, from_col, ids[2 * r]))
          throw Error(ErrorCode::kInvalidArgument, from_name + " row " + std::to_string(r) + ": the source block is negative", r);
        if (!to->get(r, to_col, ids[2 * r + 1]))
          throw Error(ErrorCode::kInvalidArgument, to_name + " row " + std::to_string(r) + ": the destination block is negative", r);
      }
      std::vector<BlockCopy> blocks(pairs * rows);
      for (std::size_t p = 0; p < pairs; ++p) {
        const Pair& q = ps[p];
        for (std::size_t r = 0; r < rows; ++r) {
          const std::uint64_t s = ids[2 * r], d = ids[2 * r + 1];
          if (s >= q.src.blocks || d >= q.dst.blocks) {
            const bool src_bad = s >= q.src.blocks;
            throw Error(ErrorCode::kInvalidArgument,
                        describe(p, r, s, d) + ": " + (src_bad ? "source" : "destination") + " block " +
                            std::to_string(src_bad ? s : d) + " is out of range (" +
                            (src_bad ? name_of(src_names, p) : name_of(dst_names, p)) + " has " +
                            std::to_string(src_bad ? q.src.blocks : q.dst.blocks) + " blocks)",
                        r);
          }
          blocks[p * rows + r] = {q.src.base + static_cast<std::int64_t>(s) * q.src.stride,
                                  q.dst.base + static_cast<std::int64_t>(d) * q.dst.stride, q.block_bytes};
        }
      }
      // An error about block i names its cache pair and mapping row; .block is the row.
      remap = [=](const Error& e) {
        if (e.block() == kNoBlock || rows == 0 || e.block() >= pairs * rows) return e;
        const std::size_t p = e.block() / rows, r = e.block() % rows;
        return Error(e.code(), std::string(e.what()) + " [" + describe(p, r, ids[2 * r], ids[2 * r + 1]) + "]", r);
      };
      auto cs = static_cast<cudaStream_t>(st);
      try {
        t = direction >= 0 ? h->engine->copy_to_device(blocks, cs) : h->engine->copy_to_host(blocks, cs);
      } catch (const Error& e) {
        throw remap(e);
      }
    }
    auto out = std::make_unique<PyTransfer>(std::move(t), std::move(remap));
    out->keep = std::move(keep);
    return out;
  }

 private:
  std::shared_ptr<EngineHolder> holder_;
};

// ---------------------------------------------------------------------------------------------
// Buffers out: typed views of memory gfd owns (pinned host pools; device memory for testing),
// exported through DLPack and, on the host, the array interface.

struct Buffer {
  std::shared_ptr<void> owner;  // the pool or allocation; DLPack exports hold it too
  std::shared_ptr<HostPool> pool;
  std::byte* data = nullptr;
  std::vector<std::int64_t> shape;
  const DType* dtype = nullptr;
  int device_type = dlpack::kCPU;
  int device_id = 0;
  bool host_accessible = true;

  std::size_t count() const {
    std::size_t n = 1;
    for (auto s : shape) n *= static_cast<std::size_t>(s);
    return n;
  }
  std::size_t itemsize() const { return std::size_t{dtype->dl.bits} / 8 * dtype->dl.lanes; }
  std::size_t nbytes() const { return count() * itemsize(); }
};

struct ExportCtx {
  std::shared_ptr<void> owner;
  std::vector<std::int64_t> shape, strides;
};

template <class M>
void fill_export(M* m, const Buffer& b, ExportCtx* ctx) {
  ctx->shape = b.shape;
  ctx->strides.assign(b.shape.size(), 1);
  for (int i = static_cast<int>(b.shape.size()) - 2; i >= 0; --i)
    ctx->strides[i] = ctx->strides[i + 1] * b.shape[i + 1];
  m->manager_ctx = ctx;
  m->dl_tensor.data = b.data;
  m->dl_tensor.device = {b.device_type, b.device_type == dlpack::kCPU ? 0 : b.device_id};
  m->dl_tensor.ndim = static_cast<std::int32_t>(b.shape.size());
  m->dl_tensor.dtype = b.dtype->dl;
  m->dl_tensor.shape = ctx->shape.data();
  m->dl_tensor.strides = ctx->strides.data();
  m->dl_tensor.byte_offset = 0;
}

// The DLPack capsule names, versioned (DLPack 1.x) and not.
constexpr char kVersionedCapsuleName[] = "dltensor_versioned";
constexpr char kCapsuleName[] = "dltensor";

// Fills `m` for `b` and wraps it in a capsule named `kName`. The tensor's deleter frees it and
// `ctx`; the capsule calls it when nobody consumed the capsule (the protocol's rule: the
// producer frees an unconsumed capsule).
template <class M, const char* kName>
py::object dlpack_capsule(M* m, const Buffer& b, ExportCtx* ctx) {
  fill_export(m, b, ctx);
  m->deleter = [](M* self) {
    delete static_cast<ExportCtx*>(self->manager_ctx);
    delete self;
  };
  return py::reinterpret_steal<py::object>(PyCapsule_New(m, kName, [](PyObject* cap) {
    if (PyCapsule_IsValid(cap, kName)) {
      auto* t = static_cast<M*>(PyCapsule_GetPointer(cap, kName));
      t->deleter(t);
    }
  }));
}

py::object buffer_dlpack(const Buffer& b, py::object stream, py::object max_version, py::object dl_device,
                         py::object copy) {
  (void)stream;  // the memory is ready: nothing is pending on any stream
  if (!copy.is_none() && copy.cast<bool>()) throw py::buffer_error("gfd buffers are exported without copying");
  if (!dl_device.is_none()) {
    py::tuple d = dl_device;
    if (d[0].cast<int>() != b.device_type || (b.device_type != dlpack::kCPU && d[1].cast<int>() != b.device_id))
      throw py::buffer_error("gfd buffers are exported on their own device only");
  }
  auto* ctx = new ExportCtx{b.owner, {}, {}};
  const bool versioned = !max_version.is_none() && py::tuple(max_version)[0].cast<int>() >= 1;
  if (versioned) {
    auto* m = new dlpack::ManagedTensorVersioned{};
    m->version = {1, 0};
    m->flags = 0;
    return dlpack_capsule<dlpack::ManagedTensorVersioned, kVersionedCapsuleName>(m, b, ctx);
  }
  return dlpack_capsule<dlpack::ManagedTensor, kCapsuleName>(new dlpack::ManagedTensor{}, b, ctx);
}

std::vector<std::int64_t> shape_from(py::handle shape) {
  std::vector<std::int64_t> out;
  if (py::isinstance<py::int_>(shape)) out.push_back(shape.cast<std::int64_t>());
  else
    for (py::handle s : shape) out.push_back(s.cast<std::int64_t>());
  for (std::size_t i = 0; i < out.size(); ++i)
    if (out[i] < 0) bad_argument("shape[" + std::to_string(i) + "]: " + std::to_string(out[i]) + " is negative");
  return out;
}

Buffer pool_view(const std::shared_ptr<HostPool>& pool, py::handle shape, const std::string& dtype,
                 std::size_t offset) {
  Buffer b;
  b.shape = shape_from(shape);
  b.dtype = &dtype_named(dtype);
  b.pool = pool;
  b.owner = pool;
  if (offset % b.itemsize() != 0)
    bad_argument("offset: " + std::to_string(offset) + " is not a multiple of the element size " +
                 std::to_string(b.itemsize()));
  if (offset > pool->size() || b.nbytes() > pool->size() - offset)
    bad_argument("shape: " + std::to_string(b.nbytes()) + " bytes at offset " + std::to_string(offset) +
                 " do not fit in the pool's " + std::to_string(pool->size()) + " bytes");
  b.data = pool->data() + offset;
  return b;
}

std::shared_ptr<HostPool> make_pool(std::size_t bytes, int device, int numa_node, bool reg,
                                    std::shared_ptr<detail::Device> on) {
  HostPoolOptions o{.bytes = bytes, .device = device, .numa_node = numa_node, .register_memory = reg};
  py::gil_scoped_release nogil;  // pinning takes a while for a large pool
  if (on) return std::make_shared<HostPool>(detail::HostPoolAccess::make(o, std::move(on)));
  return std::make_shared<HostPool>(o);
}

// ---------------------------------------------------------------------------------------------

}  // namespace
}  // namespace gfd::python

using namespace gfd;
using namespace gfd::python;

PYBIND11_MODULE(_gfd, m) {
  m.doc() = "gfd's compiled core; use the gfd package.";

  py::dict error_defaults;  // class attributes: instances made in Python read these
  error_defaults["code"] = py::str("invalid_argument");
  error_defaults["block"] = py::none();
  g_error_type = PyErr_NewExceptionWithDoc(
      "gfd.Error",
      "Every error gfd reports. `code` names the kind ('invalid_argument', 'cuda', 'system', "
      "'shutdown', 'no_device', ...); `block` is the index of the offending block (for "
      "swap_blocks: the row of the block mapping), or None. The message says exactly what and where.",
      PyExc_RuntimeError, error_defaults.ptr());
  if (g_error_type == nullptr) throw py::error_already_set();
  m.attr("Error") = py::handle(g_error_type);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      py::object exc = make_error(e);
      PyErr_SetObject(g_error_type, exc.ptr());
    }
  });

  std::vector<std::string> option_names, stats_names;
  for (const OptionField& f : kOptionFields) option_names.emplace_back(f.name);
  for (const StatsField& f : kStatsFields) stats_names.emplace_back(f.name);
  m.attr("option_names") = py::cast(option_names);
  m.attr("stats_names") = py::cast(stats_names);
  m.attr("default_options") = options_dict(EngineOptions{});
  std::vector<std::string> dtypes;
  for (const DType& t : kDTypes) dtypes.emplace_back(t.name);
  m.attr("dtype_names") = py::cast(dtypes);
  m.def("backend_names", [] {
    std::vector<std::string> v;
    for (Backend b : kAllBackends) v.emplace_back(to_string(b));
    return v;
  });
  m.def("cuda_device_count", [] { return detail::cuda_device_count(); },
        "Usable CUDA devices (0 without a driver or GPU).");

  py::class_<PyTransfer>(m, "_Transfer")
      .def("done", &PyTransfer::done)
      .def("wait", &PyTransfer::wait, py::arg("timeout") = py::none())
      .def("error", &PyTransfer::error)
      .def_property_readonly("bytes", &PyTransfer::bytes)
      .def_readwrite("keep", &PyTransfer::keep);

  using Names = std::vector<std::pair<std::string, std::size_t>>;
  py::class_<PyEngine>(m, "_Engine")
      .def(py::init<std::optional<int>, const py::dict&, bool>(), py::arg("device"), py::arg("options"),
           py::arg("from_env"))
      .def("close", &PyEngine::close)
      .def_property_readonly("closed", &PyEngine::closed)
      .def_property_readonly("emulated", &PyEngine::emulated)
      .def_property_readonly("device", &PyEngine::device)
      .def("options", &PyEngine::options)
      .def("stats", &PyEngine::stats)
      .def("copy_to_device",
           [](PyEngine& e, py::handle s, py::handle d, py::handle n, std::optional<std::uintptr_t> st) {
             return e.copy(Direction::kToDevice, s, d, n, st);
           })
      .def("copy_to_host",
           [](PyEngine& e, py::handle s, py::handle d, py::handle n, std::optional<std::uintptr_t> st) {
             return e.copy(Direction::kToHost, s, d, n, st);
           })
      .def("swap", [](PyEngine& e, const py::sequence& srcs, const py::sequence& dsts, py::handle mapping,
                      py::handle src_ids, py::handle dst_ids, std::optional<std::uintptr_t> st, const std::string& fn,
                      const Names& src_names, const Names& dst_names) {
        return e.swap(srcs, dsts, mapping, src_ids, dst_ids, st, fn, src_names, dst_names);
      });

  py::class_<HostPool, std::shared_ptr<HostPool>>(m, "_HostPool")
      .def(py::init([](std::size_t bytes, int device, int numa_node, bool reg) {
             return make_pool(bytes, device, numa_node, reg, nullptr);
           }),
           py::arg("bytes"), py::arg("device"), py::arg("numa_node"), py::arg("register"))
      .def_property_readonly("address", [](const HostPool& p) { return reinterpret_cast<std::uintptr_t>(p.data()); })
      .def_property_readonly("nbytes", &HostPool::size)
      .def_property_readonly("hugepages", [](const HostPool& p) { return std::string(to_string(p.hugepages())); })
      .def_property_readonly("numa_node", &HostPool::numa_node)
      .def_property_readonly("registered", &HostPool::registered)
      .def_property_readonly("device", &HostPool::device)
      .def("view", [](const std::shared_ptr<HostPool>& p, py::handle shape, const std::string& dtype,
                      std::size_t offset) { return pool_view(p, shape, dtype, offset); },
           py::arg("shape"), py::arg("dtype"), py::arg("offset") = 0);

  py::class_<Buffer>(m, "Buffer", R"doc(
A typed view of memory gfd owns: a pinned host pool (gfd.empty_pinned, HostPool.view) or, for
tests, device memory. torch.from_dlpack(buffer) and numpy.from_dlpack(buffer) wrap it without a
copy (numpy.asarray too, for host memory); the memory lives as long as the buffer or any tensor
made from it.)doc")
      .def("__dlpack__", &buffer_dlpack, py::kw_only(), py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(), py::arg("copy") = py::none(),
           "DLPack export (no copy).")
      .def("__dlpack_device__", [](const Buffer& b) {
        return py::make_tuple(b.device_type, b.device_type == dlpack::kCPU ? 0 : b.device_id);
      }, "(DLPack device type, device id): (1, 0) for host memory, (2, ordinal) for a GPU's.")
      .def_property_readonly("__array_interface__", [](const Buffer& b) -> py::dict {
        if (!b.host_accessible) throw py::attribute_error("device memory has no __array_interface__");
        py::dict d;
        py::tuple shape(b.shape.size());
        for (std::size_t i = 0; i < b.shape.size(); ++i) shape[i] = py::int_(b.shape[i]);
        d["shape"] = shape;
        d["typestr"] = b.dtype->typestr;
        d["data"] = py::make_tuple(reinterpret_cast<std::uintptr_t>(b.data), false);
        d["strides"] = py::none();
        d["version"] = 3;
        return d;
      })
      .def_property_readonly("ptr", [](const Buffer& b) { return reinterpret_cast<std::uintptr_t>(b.data); },
                             "Address of the first element.")
      .def_property_readonly("shape", [](const Buffer& b) { return py::tuple(py::cast(b.shape)); }, "Dimensions (a tuple).")
      .def_property_readonly("dtype", [](const Buffer& b) { return std::string(b.dtype->name); },
                             "Element type name ('float16', 'bfloat16', 'uint8', ...).")
      .def_property_readonly("itemsize", &Buffer::itemsize, "Bytes per element.")
      .def_property_readonly("nbytes", &Buffer::nbytes, "Bytes of the view.")
      .def_property_readonly("is_host", [](const Buffer& b) { return b.device_type == dlpack::kCPU; },
                             "True for host memory, False for device memory.")
      .def_property_readonly("pool", [](const Buffer& b) -> py::object {
        return b.pool ? py::cast(b.pool) : py::none();
      }, "The HostPool behind a host buffer, or None.")
      .def("__repr__", [](const Buffer& b) {
        std::string s = "gfd.Buffer(shape=(";
        for (std::size_t i = 0; i < b.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(b.shape[i]);
        if (b.shape.size() == 1) s += ",";
        s += "), dtype=" + std::string(b.dtype->name) + ", ";
        s += b.device_type == dlpack::kCPU ? std::string("host") : "cuda:" + std::to_string(b.device_id);
        if (b.pool)
          s += std::string(", hugepages=") + to_string(b.pool->hugepages()) + ", numa_node=" +
               std::to_string(b.pool->numa_node()) + ", registered=" + (b.pool->registered() ? "True" : "False");
        return s + ")";
      });

  // Testing hooks (gfd._testing): the emulated device, whose "device memory" is host memory, so
  // that the whole binding runs without a GPU; and device-memory helpers for any engine.
  py::module_ t = m.def_submodule("_testing", "Testing hooks: see gfd._testing.");
  t.def("emulated_engine", [](const py::dict& options, std::uint32_t copy_delay_us, int ordinal,
                              const std::string& fault) {
    return std::make_unique<PyEngine>(options, copy_delay_us, ordinal, fault);
  }, py::arg("options"), py::arg("copy_delay_us") = 0, py::arg("ordinal") = 0, py::arg("fault") = "");
  t.def("device_buffer", [](PyEngine& e, py::handle shape, const std::string& dtype) {
    auto h = e.holder();
    detail::Device& d = e.device_of(*h);
    Buffer b;
    b.shape = shape_from(shape);
    b.dtype = &dtype_named(dtype);
    void* p = nullptr;
    {
      KeepCurrentDevice keep;
      p = d.alloc_device(std::max<std::size_t>(b.nbytes(), 1));
    }
    std::shared_ptr<detail::Device> dev = h->device;
    b.owner = std::shared_ptr<void>(p, [dev](void* q) { dev->free_device(q); });
    b.data = static_cast<std::byte*>(p);
    b.device_type = dlpack::kCUDA;
    b.device_id = h->ordinal;
    b.host_accessible = h->emulated;  // emulated device memory is host memory
    return b;
  }, py::arg("engine"), py::arg("shape"), py::arg("dtype"));
  t.def("pinned_buffer", [](PyEngine& e, py::handle shape, const std::string& dtype) {
    auto h = e.holder();
    Buffer probe;
    probe.shape = shape_from(shape);
    probe.dtype = &dtype_named(dtype);
    auto pool = make_pool(std::max<std::size_t>(probe.nbytes(), 1), h->ordinal, -2, true,
                          h->emulated ? h->device : nullptr);
    return pool_view(pool, shape, dtype, 0);
  }, py::arg("engine"), py::arg("shape"), py::arg("dtype"));
  t.def("create_stream", [](PyEngine& e) {
    auto h = e.holder();
    KeepCurrentDevice keep;
    return reinterpret_cast<std::uintptr_t>(e.device_of(*h).create_stream());
  });
  t.def("destroy_stream", [](PyEngine& e, std::uintptr_t s) {
    auto h = e.holder();
    py::gil_scoped_release nogil;
    e.device_of(*h).destroy_stream(reinterpret_cast<detail::StreamHandle>(s));
  });
  t.def("stream_sync", [](PyEngine& e, std::optional<std::uintptr_t> s) {
    auto h = e.holder();
    detail::StreamHandle st = e.stream_of(*h, s);
    py::gil_scoped_release nogil;
    e.device_of(*h).stream_sync(st);
  }, py::arg("engine"), py::arg("stream") = py::none());
  t.def("delay", [](PyEngine& e, std::uint32_t us, std::optional<std::uintptr_t> s) {
    auto h = e.holder();
    e.device_of(*h).delay_async(us, e.stream_of(*h, s));
  }, py::arg("engine"), py::arg("microseconds"), py::arg("stream") = py::none());
  t.def("copy", [](PyEngine& e, std::uintptr_t dst, std::uintptr_t src, std::size_t bytes, bool to_device,
                   std::optional<std::uintptr_t> s) {
    auto h = e.holder();
    detail::Device& d = e.device_of(*h);
    auto st = e.stream_of(*h, s);
    py::gil_scoped_release nogil;
    if (to_device) d.copy_h2d(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes, st);
    else d.copy_d2h(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes, st);
  }, py::arg("engine"), py::arg("dst"), py::arg("src"), py::arg("bytes"), py::arg("to_device"),
     py::arg("stream") = py::none(),
     "One plain asynchronous copy on `stream` (the contiguous reference of the benchmark).");
  t.def("memset", [](PyEngine& e, std::uintptr_t dst, int value, std::size_t bytes, std::optional<std::uintptr_t> s) {
    auto h = e.holder();
    e.device_of(*h).memset_async(reinterpret_cast<void*>(dst), value, bytes, e.stream_of(*h, s));
  }, py::arg("engine"), py::arg("dst"), py::arg("value"), py::arg("bytes"), py::arg("stream") = py::none());
  t.def("pointer_kind", [](PyEngine& e, std::uintptr_t p) {
    auto h = e.holder();
    switch (e.device_of(*h).query_pointer(reinterpret_cast<const void*>(p)).kind) {
      case detail::PointerKind::kPageableHost: return "pageable";
      case detail::PointerKind::kPinnedHost: return "pinned";
      case detail::PointerKind::kDevice: return "device";
      case detail::PointerKind::kOtherDevice: return "other_device";
      case detail::PointerKind::kManaged: return "managed";
    }
    return "unknown";
  });
}
