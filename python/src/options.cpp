// The Python module's options and stats (declared in ext.hpp): EngineOptions from and to Python
// values by the option table's names, EngineStats as a dict.
#include <pybind11/stl.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "ext.hpp"

namespace gfd::python {

// ---------------------------------------------------------------------------------------------
// Options and stats: one table per struct, checked against the struct's field count at compile
// time, so that a new EngineOptions or EngineStats field cannot be forgotten here.

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

template <class T>
py::object to_py(const T& v) {
  if constexpr (std::is_enum_v<T>)
    return py::str(to_string(v));
  else
    return py::cast(v);
}

// What an option takes, read from its default's text: a number (sizes with an optional K, M or G
// suffix), a bool, or a name or list (text).
enum class OptionKind { kNumber, kBool, kText };

bool number_text(const std::string& t, long long* out) {
  if (t.empty()) return false;
  std::size_t i = t[0] == '-' ? 1 : 0;
  if (i == t.size()) return false;
  long long v = 0;
  for (; i < t.size() && t[i] >= '0' && t[i] <= '9'; ++i)
    if (__builtin_mul_overflow(v, 10LL, &v) ||
        __builtin_add_overflow(v, static_cast<long long>(t[i] - '0'), &v))
      return false;
  int shift = 0;
  if (i + 1 == t.size()) {
    shift = t[i] == 'K' ? 10 : t[i] == 'M' ? 20 : t[i] == 'G' ? 30 : -1;
    if (shift < 0) return false;
  } else if (i != t.size()) {
    return false;
  }
  if (out != nullptr) *out = (t[0] == '-' ? -v : v) << shift;
  return true;
}

OptionKind option_kind(const std::string& name) {
  static const EngineOptions defaults{};
  const std::string t = defaults.get(name);
  if (t == "true" || t == "false") return OptionKind::kBool;
  if (number_text(t, nullptr)) return OptionKind::kNumber;
  return OptionKind::kText;
}

py::object option_value(const EngineOptions& o, const std::string& name) {
  const std::string t = o.get(name);
  switch (option_kind(name)) {
    case OptionKind::kBool:
      return py::bool_(t == "true");
    case OptionKind::kNumber: {
      long long v = 0;
      if (number_text(t, &v)) return py::int_(v);
      return py::str(t);
    }
    case OptionKind::kText:
      break;
  }
  return py::str(t);
}

struct StatsField {
  const char* name;
  py::object (*get)(const EngineStats&);
};
#define GFD_STAT(f)                                                   \
  StatsField {                                                        \
#f, [](const EngineStats& s) -> py::object { return to_py(s.f); } \
  }
const StatsField kStatsFields[] = {
    GFD_STAT(bytes),          GFD_STAT(transfers),      GFD_STAT(blocks),
    GFD_STAT(chunks),         GFD_STAT(direct_copies),  GFD_STAT(strided_copies),
    GFD_STAT(gather_seconds), GFD_STAT(plan_seconds),   GFD_STAT(submit_wait_seconds),
    GFD_STAT(hugepages),      GFD_STAT(numa_node),      GFD_STAT(gather_threads),
    GFD_STAT(staging_bytes),  GFD_STAT(slot_bytes),     GFD_STAT(cpus),
    GFD_STAT(cpu_sharing),    GFD_STAT(staging_writes),
};
#undef GFD_STAT
static_assert(std::size(kStatsFields) == count_fields<EngineStats>(),
              "EngineStats has a field that kStatsFields (python/src/options.cpp) lacks");

}  // namespace

EngineOptions options_from(EngineOptions o, const py::dict& kwargs) {
  // One source of truth: the library's option table (EngineOptions::names/set/get); values are
  // handed over as the text EngineOptions::set reads, after Python's types are checked here.
  for (auto [key, value] : kwargs) {
    const std::string k = py::str(key);
    const std::vector<std::string> names = EngineOptions::names();
    if (std::find(names.begin(), names.end(), k) == names.end()) {
      std::string known;
      for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
      bad_type("Engine: unknown option '" + k + "' (options: " + known + ")");
    }
    const std::string what = "Engine: option '" + k + "'";
    std::string text;
    switch (option_kind(k)) {
      case OptionKind::kBool:
        if (!PyBool_Check(value.ptr()) && type_name(value) != "numpy.bool_" &&
            type_name(value) != "numpy.bool")
          bad_type(what + " takes a bool, not " + type_name(value));
        text = PyObject_IsTrue(value.ptr()) == 1 ? "true" : "false";
        break;
      case OptionKind::kNumber:
        if (py::isinstance<py::str>(value)) {
          text = py::str(value);
        } else {
          if (!integer_like(value))
            bad_type(what + " takes an int (sizes also a str like '64M'), not " +
                     (PyBool_Check(value.ptr()) ? std::string("bool") : type_name(value)));
          text = int_value(value, what).text();
        }
        break;
      case OptionKind::kText:
        if (!py::isinstance<py::str>(value))
          bad_type(what + " takes a str, not " + type_name(value));
        text = py::str(value);
        break;
    }
    try {
      o.set(k, text);
    } catch (const Error& e) {
      bad_argument("Engine: " + std::string(e.what()));
    }
  }
  return o;
}

py::dict options_dict(const EngineOptions& o) {
  py::dict d;
  for (const std::string& n : EngineOptions::names()) d[py::str(n)] = option_value(o, n);
  return d;
}

py::dict stats_dict(const EngineStats& s) {
  py::dict d;
  for (const StatsField& f : kStatsFields) d[f.name] = f.get(s);
  return d;
}

std::vector<std::string> option_names() { return EngineOptions::names(); }

std::vector<std::string> stats_names() {
  std::vector<std::string> v;
  for (const StatsField& f : kStatsFields) v.emplace_back(f.name);
  return v;
}

}  // namespace gfd::python
