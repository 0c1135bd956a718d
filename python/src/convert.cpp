// The Python module's conversions (declared in ext.hpp): gfd.Error, options and stats tables,
// element types. Tensors and integer arrays in: arrays.cpp.
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
    GFD_OPTION(chunk_bytes_to_host),
    GFD_OPTION(first_chunk_bytes),
    GFD_OPTION(piece_bytes),
    GFD_OPTION(direct_min_bytes),
    GFD_OPTION(direct_min_bytes_to_host),
    GFD_OPTION(direct_split_min_bytes),
    GFD_OPTION(direct_split_percent),
    GFD_OPTION(strided_min_rows),
    GFD_OPTION(strided_min_bytes),
    GFD_OPTION(host_direct),
    GFD_OPTION(plan_from_ids),
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
    GFD_OPTION(batch_placement),
    GFD_OPTION(defer_slot_waits),
    GFD_OPTION(batch_packing),
    GFD_OPTION(placement_chunks),
    GFD_OPTION(placement_blocks),
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
    GFD_STAT(chunks),         GFD_STAT(scattered_chunks), GFD_STAT(placements), GFD_STAT(packings),
    GFD_STAT(slots_deferred), GFD_STAT(host_direct_chunks), GFD_STAT(direct_copies),
    GFD_STAT(strided_copies), GFD_STAT(id_planned_transfers),
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

}  // namespace gfd::python
