// The Python module's conversions (declared in ext.hpp): gfd.Error, options and stats tables,
// element types, tensors in through DLPack and the array interfaces, integer arrays.
#include "ext.hpp"

#include <pybind11/stl.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace gfd::python {

// ---------------------------------------------------------------------------------------------
// Errors: one Python exception class, gfd.Error(RuntimeError), with .code and .block.

namespace {
PyObject* g_error_type = nullptr;
}  // namespace

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

void register_error_type(py::module_& m) {
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

std::string type_name(py::handle v) { return py::str(py::type::of(v).attr("__name__")); }

namespace {

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
void assign(std::string& out, py::handle v, const char* name) {
  if (!py::isinstance<py::str>(v))
    throw py::type_error(std::string("Engine: option '") + name + "' takes a str, not " + type_name(v));
  out = v.cast<std::string>();
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
    GFD_OPTION(direct_min_bytes_to_host),
    GFD_OPTION(strided_min_rows),
    GFD_OPTION(inline_gather_bytes),
    GFD_OPTION(gather_threads),
    GFD_OPTION(copy_streams),
    GFD_OPTION(numa_node),
    GFD_OPTION(use_all_local_cpus),
    GFD_OPTION(cpus),
    GFD_OPTION(spin_us),
    GFD_OPTION(submitter_gathers),
    GFD_OPTION(staging_writes),
    GFD_OPTION(preissue),
    GFD_OPTION(time_dmas),
    GFD_OPTION(kernel_max_bytes),
    GFD_OPTION(pageable_cache_ms),
    GFD_OPTION(check_overlaps),
    GFD_OPTION(backend),
};
#undef GFD_OPTION
static_assert(std::size(kOptionFields) == count_fields<EngineOptions>(),
              "EngineOptions has a field that kOptionFields (python/src/convert.cpp) lacks");

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
              "EngineStats has a field that kStatsFields (python/src/convert.cpp) lacks");

}  // namespace

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

py::dict stats_dict(const EngineStats& s) {
  py::dict d;
  for (const StatsField& f : kStatsFields) d[f.name] = f.get(s);
  return d;
}

std::vector<std::string> option_names() {
  std::vector<std::string> v;
  for (const OptionField& f : kOptionFields) v.emplace_back(f.name);
  return v;
}

std::vector<std::string> stats_names() {
  std::vector<std::string> v;
  for (const StatsField& f : kStatsFields) v.emplace_back(f.name);
  return v;
}

// ---------------------------------------------------------------------------------------------
// Element types, by the names torch and numpy use.

namespace {
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
}  // namespace

const DType& dtype_named(const std::string& name) {
  for (const DType& t : kDTypes)
    if (name == t.name) return t;
  std::string known;
  for (const DType& t : kDTypes) known += (known.empty() ? "" : ", ") + std::string(t.name);
  bad_argument("dtype: '" + name + "' is not a dtype gfd knows (" + known + ")");
}

std::vector<std::string> dtype_names() {
  std::vector<std::string> v;
  for (const DType& t : kDTypes) v.emplace_back(t.name);
  return v;
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

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace gfd::python
