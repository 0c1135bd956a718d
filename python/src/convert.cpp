// The Python module's conversions (declared in ext.hpp): integers in, element types. Errors:
// errors.cpp. Options and stats: options.cpp. Tensors and integer arrays in: arrays.cpp.
#include <cuda_runtime_api.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "ext.hpp"

namespace gfd::python {

// ---------------------------------------------------------------------------------------------
// Integers in.

std::string IntValue::text() const {
  if (huge) return negative ? "a negative integer beyond 64 bits" : "an integer beyond 64 bits";
  return (negative ? "-" : "") + std::to_string(magnitude);
}

// Whether `v` is an integer as gfd takes it: a Python int that is not a bool, or a numpy or
// torch integer scalar (its dtype names an int type).
bool integer_like(py::handle v) {
  if (PyBool_Check(v.ptr())) return false;
  if (PyLong_Check(v.ptr())) return true;
  static PyObject* const dtype_name = PyUnicode_InternFromString("dtype");
  PyObject* dt = PyObject_GetAttr(v.ptr(), dtype_name);
  if (dt == nullptr) {
    PyErr_Clear();
    return false;
  }
  const py::object dtype = py::reinterpret_steal<py::object>(dt);
  std::string s = py::str(dtype);
  if (s.rfind("torch.", 0) == 0) s = s.substr(6);
  static const char* const kInts[] = {"int8",  "int16",  "int32",  "int64",
                                      "uint8", "uint16", "uint32", "uint64"};
  bool ok = false;
  for (const char* k : kInts) ok = ok || s == k;
  // A numpy or torch scalar, or a one-element tensor: __index__ gives the value.
  return ok && PyIndex_Check(v.ptr());
}

IntValue int_value(py::handle v, const std::string& name) {
  if (!integer_like(v))
    bad_type(name + ": expected an int, got " +
             (PyBool_Check(v.ptr()) ? std::string("bool") : type_name(v)));
  PyObject* idx = PyNumber_Index(v.ptr());
  if (idx == nullptr) {
    PyErr_Clear();
    bad_type(name + ": expected an int, got " + type_name(v));
  }
  const py::object big = py::reinterpret_steal<py::object>(idx);
  IntValue out;
  int overflow = 0;
  const long long s = PyLong_AsLongLongAndOverflow(big.ptr(), &overflow);
  if (overflow == 0) {
    out.negative = s < 0;
    out.magnitude = s < 0 ? 0 - static_cast<std::uint64_t>(s) : static_cast<std::uint64_t>(s);
    return out;
  }
  if (overflow < 0) {
    out.negative = true;
    out.huge = true;  // below -2**63: beyond anything a range admits
    return out;
  }
  const unsigned long long u = PyLong_AsUnsignedLongLong(big.ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    out.huge = true;
    return out;
  }
  out.magnitude = u;
  return out;
}

std::int64_t int_arg(py::handle v, const std::string& name, std::int64_t lo, std::int64_t hi) {
  const IntValue x = int_value(v, name);
  const __int128 value =
      x.negative ? -static_cast<__int128>(x.magnitude) : static_cast<__int128>(x.magnitude);
  if (x.huge || value < lo || value > hi) {
    if (x.negative && lo == 0) bad_argument(name + ": " + x.text() + " is negative");
    bad_argument(name + ": " + x.text() + " is out of range [" + std::to_string(lo) + ", " +
                 std::to_string(hi) + "]");
  }
  return static_cast<std::int64_t>(value);
}

std::uint64_t uint_arg(py::handle v, const std::string& name, std::uint64_t hi) {
  const IntValue x = int_value(v, name);
  if (x.negative && (x.huge || x.magnitude != 0))
    bad_argument(name + ": " + x.text() + " is negative");
  if (x.huge || x.magnitude > hi)
    bad_argument(name + ": " + x.text() + " is out of range [0, " + std::to_string(hi) + "]");
  return x.magnitude;
}

std::uintptr_t host_address_lowest() {
  // Linux maps nothing below vm.mmap_min_addr (64 KiB by default); below 64 KiB is taken as
  // outside the user address space even where that limit was lowered (only a MAP_FIXED mapping
  // made for the purpose lies there, never memory a runtime hands gfd).
  static const std::uintptr_t lowest = [] {
    std::uintptr_t v = 65536;
    if (FILE* f = std::fopen("/proc/sys/vm/mmap_min_addr", "r")) {
      unsigned long long x = 0;
      if (std::fscanf(f, "%llu", &x) == 1 && x > v) v = static_cast<std::uintptr_t>(x);
      std::fclose(f);
    }
    return v;
  }();
  return lowest;
}

std::uintptr_t host_address_end() {
#if defined(__x86_64__)
  // 47 bits of user address space (4-level paging; with 5-level paging Linux maps above it only
  // where a mapping asks for it).
  return std::uintptr_t{1} << 47;
#elif defined(__aarch64__)
  return std::uintptr_t{1} << 52;
#else
  return std::uintptr_t{1} << 56;
#endif
}

void check_host_range(std::uint64_t p, std::uint64_t bytes, const std::string& name,
                      std::uint64_t block) {
  const std::uint64_t lo = host_address_lowest(), end = host_address_end();
  if (p < lo || p >= end || bytes > end - p) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(p));
    bad_argument(name + ": host address " + buf +
                     (bytes > 0 ? " + " + std::to_string(bytes) + " bytes" : "") +
                     " is outside the user address space",
                 block);
  }
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

const DType& dtype_named(const std::string& name, const std::string& what) {
  for (const DType& t : kDTypes)
    if (name == t.name) return t;
  std::string known;
  for (const DType& t : kDTypes) known += (known.empty() ? "" : ", ") + std::string(t.name);
  bad_argument(what + ": '" + name + "' is not a dtype gfd knows (" + known + ")");
}

const DType& dtype_arg(py::handle dtype, const std::string& what) {
  std::string name;
  if (py::isinstance<py::str>(dtype)) {
    name = py::str(dtype);
  } else if (PyType_Check(dtype.ptr())) {  // a numpy scalar type, or Python's float, int, bool
    if (dtype.ptr() == reinterpret_cast<PyObject*>(&PyFloat_Type))
      name = "float64";
    else if (dtype.ptr() == reinterpret_cast<PyObject*>(&PyLong_Type))
      name = "int64";
    else if (dtype.ptr() == reinterpret_cast<PyObject*>(&PyBool_Type))
      name = "bool";
    else
      name = py::str(dtype.attr("__name__"));
  } else {
    // numpy.dtype has .name; torch.float16 prints as 'torch.float16'.
    py::object n = py::getattr(dtype, "name", py::none());
    name = py::isinstance<py::str>(n) ? std::string(py::str(n)) : std::string(py::str(dtype));
  }
  if (name.rfind("torch.", 0) == 0) name = name.substr(6);
  return dtype_named(name, what);
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
