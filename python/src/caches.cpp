// Cache sets from Python: tensors described to the engine once (register_tensors), transfers on
// them by block ids (copy_on_set), and the small cache that finds swap_blocks' set again from its
// tensors (SetCache), so that a runtime's per-call cost is the ids, not the tensors.
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "engine_core.hpp"
#include "engine_holder.hpp"

namespace gfd::python {
namespace {

std::string name_of(const Names& names, std::size_t i) {
  for (const auto& [prefix, count] : names) {
    if (count == 0) return prefix;  // a single tensor
    if (i < count) return prefix + "[" + std::to_string(i) + "]";
    i -= count;
  }
  return std::string("tensor ") + std::to_string(i);
}

// One cache tensor as a block array: the first dimension indexes blocks, the rest of a block is
// compact (one contiguous range).
BlockArray block_array(const TensorView& v, const std::string& fn, const std::string& name) {
  if (v.shape.empty()) bad_argument(fn + ": " + name + ": a cache needs a first (block) dimension; got a scalar");
  const std::size_t item = item_bytes(v.dtype, fn + ": " + name);
  std::int64_t expect = 1;
  for (int i = static_cast<int>(v.shape.size()) - 1; i >= 1; --i) {
    if (v.shape[i] != 1 && v.strides[i] != expect)
      bad_argument(fn + ": " + name + ": each block must be contiguous (dimensions 1.. of the cache "
                                      "compact, row-major); dimension " + std::to_string(i) + " has stride " +
                   std::to_string(v.strides[i]) + ", expected " + std::to_string(expect));
    expect *= v.shape[i];
  }
  if (v.shape[0] > 1 && v.strides[0] < expect)
    bad_argument(fn + ": " + name + ": blocks overlap or run backwards (stride of dimension 0 is " +
                 std::to_string(v.strides[0]) + " elements, a block has " + std::to_string(expect) + ")");
  BlockArray a;
  a.base = v.data;
  a.blocks = static_cast<std::size_t>(v.shape[0]);
  a.block_bytes = static_cast<std::size_t>(expect) * item;
  a.stride = v.shape[0] > 1 ? static_cast<std::size_t>(v.strides[0]) * item : a.block_bytes;
  return a;
}

// Ids as the engine reads them: 4- or 8-byte signed integers in place; anything else copied.
BlockIds block_ids(const IntArray& a, std::size_t column, std::vector<std::int64_t>& copy) {
  const std::size_t n = a.rows();
  if (a.is_signed && (a.itemsize == 8 || a.itemsize == 4))
    return BlockIds(a.data + static_cast<std::int64_t>(column) * a.strides[1], n, a.strides[0],
                    static_cast<std::uint8_t>(a.itemsize));
  copy.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t v = 0;
    if (!a.get(i, column, v) || v > static_cast<std::uint64_t>(INT64_MAX)) v = static_cast<std::uint64_t>(-1);
    copy[i] = static_cast<std::int64_t>(v);
  }
  return BlockIds(copy.data(), n, 8, 8);
}

}  // namespace

std::shared_ptr<PyCacheSet> register_tensors(EngineHolder& h, const py::sequence& firsts,
                                             const py::sequence& seconds, const std::string& fn,
                                             const Names& first_names, const Names& second_names,
                                             bool host_first, std::optional<detail::StreamHandle> stream) {
  const std::size_t pairs = firsts.size();
  if (seconds.size() != pairs)
    bad_argument(fn + ": " + std::to_string(pairs) + (host_first ? " host caches but " : " source caches but ") +
                 std::to_string(seconds.size()) + (host_first ? " device caches" : " destination caches"));
  std::vector<CachePair> ps(pairs);
  std::vector<std::string> labels(2 * pairs);
  // With a stream (a call that registers its tensors as it goes), device tensors are made ready
  // on it as their protocols ask: DLPack's producer, the CUDA array interface's stream. A set
  // registered ahead (Engine.register_caches) reads only where the memory is and its shape;
  // each transfer on it is ordered on its caller's stream.
  std::optional<std::uintptr_t> stream_value;
  if (stream) stream_value = reinterpret_cast<std::uintptr_t>(*stream);
  std::function<void(std::uintptr_t)> sync_to;
  if (stream)
    sync_to = [&h, st = *stream](std::uintptr_t producer) {
      KeepCurrentDevice keep;
      detail::Device& d = h.device_of();
      detail::EventHandle e = d.create_event(false);
      d.record_event(e, reinterpret_cast<detail::StreamHandle>(producer));
      d.stream_wait_event(st, e);
      d.destroy_event(e);
    };
  int direction = 0;  // +1: the first list is the host side
  for (std::size_t p = 0; p < pairs; ++p) {
    const std::string an = name_of(first_names, p), bn = name_of(second_names, p);
    TensorView a = tensor_view(firsts[p], fn + ": " + an, stream_value, sync_to);
    TensorView b = tensor_view(seconds[p], fn + ": " + bn, stream_value, sync_to);
    for (const auto* v : {&a, &b}) {
      const std::string& n = v == &a ? an : bn;
      if (!v->host() && !v->cuda())
        bad_argument(fn + ": " + n + " is on " + device_text(*v) +
                     "; gfd moves blocks between host memory and device memory of the engine's GPU");
      if (v->cuda() && v->device_id >= 0 && v->device_id != h.ordinal)
        bad_argument(fn + ": " + n + " is on " + device_text(*v) + ", but the engine serves GPU " +
                     std::to_string(h.ordinal));
    }
    const int dir = a.host() && b.cuda() ? 1 : a.cuda() && b.host() ? -1 : 0;
    if (dir == 0 || (host_first && dir != 1))
      bad_argument(fn + ": " + an + " is on " + device_text(a) + " and " + bn + " on " + device_text(b) +
                   (host_first ? "; the first must be host memory and the second device memory of GPU "
                               : "; one must be host memory and the other device memory of GPU ") +
                   std::to_string(h.ordinal));
    if (direction != 0 && dir != direction)
      bad_argument(fn + ": " + an + " -> " + bn + " goes the other way than " + name_of(first_names, 0) + " -> " +
                   name_of(second_names, 0) + "; one transfer moves blocks in one direction");
    direction = dir;
    if (!same_type(a.dtype, b.dtype))
      bad_argument(fn + ": " + bn + " has dtype " + dtype_text(b.dtype) + ", " + an + " " + dtype_text(a.dtype));
    const BlockArray x = block_array(a, fn, an), y = block_array(b, fn, bn);
    if (x.block_bytes != y.block_bytes)
      bad_argument(fn + ": blocks of " + an + " have " + std::to_string(x.block_bytes) + " bytes, blocks of " + bn +
                   " " + std::to_string(y.block_bytes) + " (the shapes after the first dimension must match)");
    const bool first_host = dir == 1;
    ps[p].host = first_host ? x : y;
    ps[p].device = first_host ? y : x;
    labels[2 * p] = first_host ? an : bn;
    labels[2 * p + 1] = first_host ? bn : an;
  }
  auto out = std::make_shared<PyCacheSet>();
  out->first_is_host = direction >= 0;
  out->pairs = pairs;
  if (pairs == 0) return out;  // nothing to describe: transfers on it move nothing
  py::gil_scoped_release nogil;
  KeepCurrentDevice keep;
  // A set registered ahead may be used both ways; swap_blocks' goes the way its lists say, and
  // only its destinations must not share a byte.
  using Sides = detail::CacheSetState::Sides;
  const Sides sides = host_first ? Sides::kBoth : out->first_is_host ? Sides::kDevice : Sides::kHost;
  out->set = detail::EngineCore::of(*h.engine).register_caches(ps, std::move(labels), fn, sides);
  return out;
}

std::unique_ptr<PyTransfer> copy_on_set(EngineHolder& h, const PyCacheSet& set, bool to_device,
                                        py::handle mapping, py::handle src_ids, py::handle dst_ids,
                                        detail::StreamHandle stream, const std::string& fn) {
  IntArray a, b;
  std::string src_name, dst_name;
  std::size_t src_col = 0, dst_col = 0;
  const IntArray* dst_arr = &a;
  if (!mapping.is_none()) {
    a = int_array(mapping, fn + ": block_mapping", false);
    if (a.rows() > 0 && (a.ndim != 2 || a.shape[1] != 2))
      bad_argument(fn + ": block_mapping must have shape [N, 2] (src block, dst block), got " +
                   (a.ndim == 2 ? "[" + std::to_string(a.shape[0]) + ", " + std::to_string(a.shape[1]) + "]"
                                : "[" + std::to_string(a.shape[0]) + "]"));
    dst_col = 1;
    src_name = dst_name = fn + ": block_mapping row #";
  } else {
    a = int_array(src_ids, fn + ": src_indices", false);
    b = int_array(dst_ids, fn + ": dst_indices", false);
    dst_arr = &b;
    if (a.ndim != 1 || b.ndim != 1) bad_argument(fn + ": src_indices and dst_indices must be 1-D");
    if (a.rows() != b.rows())
      bad_argument(fn + ": src_indices has " + std::to_string(a.rows()) + " entries, dst_indices " +
                   std::to_string(b.rows()));
    src_name = fn + ": src_indices row #";
    dst_name = fn + ": dst_indices row #";
  }
  Transfer t;
  if (set.pairs != 0 && a.rows() != 0) {
    std::vector<std::int64_t> src_copy, dst_copy;
    const BlockIds s = block_ids(a, src_col, src_copy);
    const BlockIds d = block_ids(*dst_arr, dst_col, dst_copy);
    const Direction dir = to_device ? Direction::kToDevice : Direction::kToHost;
    py::gil_scoped_release nogil;
    t = detail::EngineCore::of(*h.engine).submit_blocks(set.set, dir, s, d, stream, src_name, dst_name);
  }
  auto out = std::make_unique<PyTransfer>(std::move(t), nullptr);
  for (const IntArray* x : {&a, &b})
    if (x->owner) out->keep.append(x->owner);
  return out;
}

// ---------------------------------------------------------------------------------------------

bool SetCache::key_of(py::handle t, std::uintptr_t& ptr, std::uint64_t& bytes) {
  // Interned once and never released: a static py::str would be released after the
  // interpreter is gone, at process exit.
  static PyObject* const data_ptr = PyUnicode_InternFromString("data_ptr");
  static PyObject* const nbytes = PyUnicode_InternFromString("nbytes");
  // Two ints read: data_ptr() (a method call without a bound method made first) and nbytes (a
  // property). This runs for every tensor of every call; `shape`, read here before, made a
  // torch.Size and compared it, twice the cost of both (tools/py_call_cost.py).
  auto read = [&](PyObject* v, std::uint64_t& out) {
    if (v == nullptr) {
      PyErr_Clear();
      return false;
    }
    out = PyLong_AsUnsignedLongLong(v);
    Py_DECREF(v);
    if (PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    return true;
  };
  std::uint64_t p = 0;
  if (!read(PyObject_CallMethodNoArgs(t.ptr(), data_ptr), p)) return false;
  ptr = static_cast<std::uintptr_t>(p);
  return read(PyObject_GetAttr(t.ptr(), nbytes), bytes);
}

std::shared_ptr<PyCacheSet> SetCache::find(const py::sequence& a, const py::sequence& b, const std::string& fn) {
  const std::size_t na = a.size(), n = na + b.size();
  // The items without a new reference each where the lists are lists (swap_blocks makes them so).
  auto item = [&](std::size_t i) -> py::object {
    const py::sequence& s = i < na ? a : b;
    const std::size_t j = i < na ? i : i - na;
    if (PyList_Check(s.ptr())) return py::reinterpret_borrow<py::object>(PyList_GET_ITEM(s.ptr(), j));
    return s[j];
  };
  for (std::size_t k = entries_.size(); k-- > 0;) {
    Entry& e = entries_[k];
    if (e.refs.size() != n || e.fn != fn) continue;
    bool same = true;
    // The very objects first (their weak references still lead to them): cheap, and a list of
    // other tensors fails here without reading any tensor.
    for (std::size_t i = 0; i < n && same; ++i) same = PyWeakref_GetObject(e.refs[i].ptr()) == item(i).ptr();
    // Then each one's memory, as registered: where it starts and how many bytes it spans.
    for (std::size_t i = 0; i < n && same; ++i) {
      std::uintptr_t ptr = 0;
      std::uint64_t bytes = 0;
      same = key_of(item(i), ptr, bytes) && ptr == e.ptrs[i] && bytes == e.sizes[i];
    }
    if (!same) continue;
    std::shared_ptr<PyCacheSet> set = e.set;
    if (k + 1 != entries_.size()) std::rotate(entries_.begin() + k, entries_.begin() + k + 1, entries_.end());
    return set;
  }
  return nullptr;
}

void SetCache::add(const py::sequence& a, const py::sequence& b, const std::string& fn,
                   std::shared_ptr<PyCacheSet> set) {
  Entry e;
  e.fn = fn;
  e.set = std::move(set);
  const std::size_t n = a.size() + b.size();
  for (std::size_t i = 0; i < n; ++i) {
    py::handle t = i < a.size() ? a[i] : b[i - a.size()];
    std::uintptr_t ptr = 0;
    std::uint64_t bytes = 0;
    if (!key_of(t, ptr, bytes)) return;  // not a torch tensor: registered again at each call
    PyObject* ref = PyWeakref_NewRef(t.ptr(), nullptr);
    if (ref == nullptr) {
      PyErr_Clear();
      return;
    }
    e.refs.push_back(py::reinterpret_steal<py::object>(ref));
    e.ptrs.push_back(ptr);
    e.sizes.push_back(bytes);
  }
  if (entries_.size() == kEntries) entries_.erase(entries_.begin());
  entries_.push_back(std::move(e));
}

}  // namespace gfd::python
