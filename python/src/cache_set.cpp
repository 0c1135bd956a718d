// gfd.CacheSet (cache_set.hpp): tensors described to the engine once (register_caches) and
// transfers on them by block ids (copy_blocks). The engine checks the ids and the arrays; this
// file reads what only Python knows (a tensor's device, dtype and shape) and names the tensors
// as the caller passed them.
#include "cache_set.hpp"

#include <exception>
#include <functional>
#include <string>
#include <utility>

#include "ext.hpp"
#include "transfer.hpp"

namespace gfd::python {
namespace {

// One cache tensor as a block array: the first dimension indexes blocks, the rest of a block is
// compact (one contiguous range). Products of dimensions and strides are checked for overflow
// (a foreign array interface may describe any shape).
BlockArray block_array(const TensorView& v, const std::string& name) {
  if (v.shape.empty())
    bad_argument(name + ": a cache needs a first (block) dimension; got a scalar");
  for (std::size_t i = 0; i < v.shape.size(); ++i)
    if (v.shape[i] < 0) bad_argument(name + ": dimension " + std::to_string(i) + " is negative");
  const std::size_t item = item_bytes(v.dtype, name);
  std::int64_t expect = 1;
  for (int i = static_cast<int>(v.shape.size()) - 1; i >= 1; --i) {
    if (v.shape[i] != 1 && v.strides[i] != expect)
      bad_argument(
          name +
          ": each block must be contiguous (dimensions 1.. of the cache compact, row-major); "
          "dimension " +
          std::to_string(i) + " has stride " + std::to_string(v.strides[i]) + ", expected " +
          std::to_string(expect));
    if (__builtin_mul_overflow(expect, v.shape[i], &expect))
      bad_argument(name + ": a block of this shape has more elements than an address space");
  }
  std::size_t block_bytes = 0, stride = 0;
  if (__builtin_mul_overflow(static_cast<std::size_t>(expect), item, &block_bytes))
    bad_argument(name + ": a block of this shape has more bytes than an address space");
  if (v.shape[0] > 1 && v.strides[0] < expect)
    bad_argument(name + ": blocks overlap or run backwards (stride of dimension 0 is " +
                 std::to_string(v.strides[0]) + " elements, a block has " + std::to_string(expect) +
                 ")");
  if (v.shape[0] > 1 &&
      __builtin_mul_overflow(static_cast<std::size_t>(v.strides[0]), item, &stride))
    bad_argument(name + ": the block stride has more bytes than an address space");
  BlockArray a;
  a.base = v.data;
  a.blocks = static_cast<std::size_t>(v.shape[0]);
  a.block_bytes = block_bytes;
  a.stride = v.shape[0] > 1 ? stride : block_bytes;
  return a;
}

// A tensor or a list (tuple) of tensors: the tensors, and how messages name each: "host" for a
// single tensor, "host[3]" for one of a list.
std::vector<py::object> tensors_of(py::handle v, const std::string& side,
                                   std::vector<std::string>& names) {
  std::vector<py::object> out;
  if (PyList_Check(v.ptr()) || PyTuple_Check(v.ptr())) {
    for (py::handle t : py::reinterpret_borrow<py::sequence>(v)) {
      names.push_back(side + "[" + std::to_string(out.size()) + "]");
      out.push_back(py::reinterpret_borrow<py::object>(t));
    }
    return out;
  }
  if (v.is_none() || py::isinstance<py::str>(v) || py::isinstance<py::bytes>(v) ||
      PyLong_Check(v.ptr()) || PyFloat_Check(v.ptr()) || PyDict_Check(v.ptr()))
    bad_type("register_caches: " + side + ": expected a tensor or a list of tensors, got " +
             type_name(v));
  names.push_back(side);
  out.push_back(py::reinterpret_borrow<py::object>(v));
  return out;
}

Direction direction_arg(py::handle v, const std::string& name) {
  py::object value = py::reinterpret_borrow<py::object>(v);
  // gfd.Direction members are str enums: their value is the name.
  if (py::hasattr(v, "value") && !py::isinstance<py::str>(v)) value = v.attr("value");
  if (py::isinstance<py::str>(value)) {
    const std::string s = py::str(value);
    if (s == "to_device") return Direction::kToDevice;
    if (s == "to_host") return Direction::kToHost;
    bad_argument(name + ": '" + s +
                 "' is not a direction (gfd.Direction.TO_DEVICE, gfd.Direction.TO_HOST, "
                 "'to_device' or 'to_host')");
  }
  bad_type(
      name +
      ": expected gfd.Direction.TO_DEVICE, gfd.Direction.TO_HOST, 'to_device' or 'to_host', got " +
      type_name(v));
}

// The ids of a copy_blocks call as the engine reads them (it checks their values itself).
struct CallIds {
  IntArray a, b;
  std::vector<std::int64_t> src_copy, dst_copy;
  BlockIds src, dst;

  CallIds(py::handle src_ids, py::handle dst_ids)
      : a(int_array(src_ids, "copy_blocks: src_ids", false, true)),
        b(int_array(dst_ids, "copy_blocks: dst_ids", false, true)) {
    for (const IntArray* x : {&a, &b})
      if (x->ndim != 1)
        bad_argument(x->name + " must be 1-D, got " + std::to_string(x->ndim) + " dimensions");
    src = block_ids(a, src_copy);
    dst = block_ids(b, dst_copy);
  }
  bool empty() const { return a.rows() == 0 && b.rows() == 0; }
  // What a transfer keeps alive: the set(s) and the id arrays as given.
  std::vector<py::object> keep(py::handle caches, py::handle src_ids, py::handle dst_ids) const {
    std::vector<py::object> k{py::reinterpret_borrow<py::object>(caches),
                              py::reinterpret_borrow<py::object>(src_ids),
                              py::reinterpret_borrow<py::object>(dst_ids)};
    for (const IntArray* x : {&a, &b})
      if (x->owner) k.push_back(x->owner);
    return k;
  }
};

py::object transfer_object(Transfer t, std::vector<py::object> keep) {
  return py::cast(std::make_unique<PyTransfer>(std::move(t), std::move(keep)));
}

}  // namespace

std::shared_ptr<PyCacheSet> register_caches(Engine& engine, int ordinal, py::handle host,
                                            py::handle device) {
  const std::string fn = "register_caches";
  std::vector<std::string> host_names, device_names;
  const std::vector<py::object> hosts = tensors_of(host, "host", host_names);
  const std::vector<py::object> devices = tensors_of(device, "device", device_names);
  const std::size_t pairs = hosts.size();
  if (devices.size() != pairs)
    bad_argument(fn + ": " + std::to_string(pairs) + " host caches but " +
                 std::to_string(devices.size()) + " device caches");
  if (pairs == 0) bad_argument(fn + ": host: no cache given");
  std::vector<CachePair> ps(pairs);
  std::vector<std::string> names;
  for (std::size_t p = 0; p < pairs; ++p) {
    const std::string an = fn + ": " + host_names[p], bn = fn + ": " + device_names[p];
    // A set registered ahead reads only where the memory is and its shape; each transfer on it
    // is ordered on its caller's stream.
    const TensorView a = tensor_view(hosts[p], an, std::nullopt, {});
    const TensorView b = tensor_view(devices[p], bn, std::nullopt, {});
    // Both sides wrong: the arguments are given the wrong way round, and both are named.
    if (!a.host() && !b.cuda() && b.host())
      bad_argument(an + " is on " + device_text(a) + " and " + device_names[p] + " on " +
                   device_text(b) +
                   ": host and device swapped? (register_caches(host, device): host memory first)");
    if (!a.host())
      bad_argument(an + " is on " + device_text(a) + "; the host caches must be in host memory");
    if (!b.cuda())
      bad_argument(bn + " is on " + device_text(b) +
                   "; the device caches must be in device memory of GPU " +
                   std::to_string(ordinal));
    if (b.device_id >= 0 && b.device_id != ordinal)
      bad_argument(bn + " is on " + device_text(b) + ", but the engine serves GPU " +
                   std::to_string(ordinal));
    if (!same_type(a.dtype, b.dtype))
      bad_argument(bn + " has dtype " + dtype_text(b.dtype) + ", " + host_names[p] + " " +
                   dtype_text(a.dtype));
    ps[p] = {block_array(a, an), block_array(b, bn)};
    names.push_back(host_names[p]);
    names.push_back(device_names[p]);
  }
  auto out = std::make_shared<PyCacheSet>();
  out->pairs = pairs;
  {
    py::gil_scoped_release nogil;
    KeepCurrentDevice keep;
    out->set = engine.register_caches(ps, names);
  }
  out->keep.reserve(2 * pairs);
  for (const auto* side : {&hosts, &devices})
    out->keep.insert(out->keep.end(), side->begin(), side->end());
  return out;
}

py::object copy_blocks(Engine& engine, py::handle caches, py::handle direction, py::handle src_ids,
                       py::handle dst_ids, cudaStream_t stream, py::handle after_each) {
  const bool many = PyList_Check(caches.ptr()) || PyTuple_Check(caches.ptr());
  std::vector<CacheSet> sets;
  std::vector<py::object> set_objects;
  if (many) {
    for (py::handle c : py::reinterpret_borrow<py::sequence>(caches)) {
      if (!py::isinstance<PyCacheSet>(c))
        bad_type("copy_blocks: caches[" + std::to_string(sets.size()) +
                 "]: expected a gfd.CacheSet, got " + type_name(c));
      sets.push_back(c.cast<const PyCacheSet&>().set);
      set_objects.push_back(py::reinterpret_borrow<py::object>(c));
    }
    if (sets.empty()) bad_argument("copy_blocks: caches: an empty list of CacheSets");
    if (!after_each.is_none() && !PyCallable_Check(after_each.ptr()))
      bad_type("copy_blocks: after_each: expected a callable, got " + type_name(after_each));
  } else {
    if (!after_each.is_none())
      bad_argument("copy_blocks: after_each: only with a list of CacheSets");
    if (!py::isinstance<PyCacheSet>(caches))
      bad_type("copy_blocks: caches: expected a gfd.CacheSet, got " + type_name(caches));
  }
  const Direction dir = direction_arg(direction, "copy_blocks: direction");
  const CallIds ids(src_ids, dst_ids);
  if (!many) {
    Transfer t;
    if (!ids.empty()) {
      const CacheSet& set = caches.cast<const PyCacheSet&>().set;
      py::gil_scoped_release nogil;
      t = engine.copy_blocks(set, dir, ids.src, ids.dst, stream);
    }
    return transfer_object(std::move(t), ids.keep(caches, src_ids, dst_ids));
  }
  std::vector<Transfer> ts;
  std::exception_ptr raised;  // the first exception of after_each: later ones are not called
  if (!ids.empty()) {
    std::function<void(std::size_t)> each;
    if (!after_each.is_none())
      each = [&](std::size_t k) {
        if (raised) return;
        py::gil_scoped_acquire gil;
        try {
          after_each(k);
        } catch (...) {
          raised = std::current_exception();
        }
      };
    py::gil_scoped_release nogil;
    ts = engine.copy_blocks(sets, dir, ids.src, ids.dst, stream, each);
  }
  if (raised) std::rethrow_exception(raised);
  py::list out;
  for (std::size_t k = 0; k < ts.size(); ++k)
    out.append(transfer_object(std::move(ts[k]), ids.keep(set_objects[k], src_ids, dst_ids)));
  return out;
}

void register_cache_set(py::module_& m) {
  py::class_<PyCacheSet, std::shared_ptr<PyCacheSet>>(m, "CacheSet", R"doc(
Caches registered with one engine (Engine.register_caches): pairs of a host and a device tensor
of blocks, checked once; transfers on it (Engine.copy_blocks) pass only block ids. Keeps its
tensors alive.)doc")
      .def_property_readonly(
          "pairs", [](const PyCacheSet& s) { return s.pairs; },
          "Number of (host, device) tensor pairs.")
      .def_property_readonly(
          "host_pinned", [](const PyCacheSet& s) { return s.set.host_pinned(); },
          "Whether every host tensor lies in pinned memory.")
      .def_property_readonly(
          "bytes_per_id", [](const PyCacheSet& s) { return s.set.bytes_per_id(); },
          "Bytes one block id moves (every pair's block size summed).")
      .def_property_readonly(
          "host_blocks", [](const PyCacheSet& s) { return s.set.host_blocks(); },
          "Blocks of the smallest host tensor (host ids must be below).")
      .def_property_readonly(
          "device_blocks", [](const PyCacheSet& s) { return s.set.device_blocks(); },
          "Blocks of the smallest device tensor (device ids must be below).")
      .def_property_readonly(
          "device", [](const PyCacheSet& s) { return s.set.device(); },
          "The CUDA device the set was registered for.")
      .def("__repr__", [](const PyCacheSet& s) {
        return "gfd.CacheSet(" + std::to_string(s.pairs) + " pairs, " +
               std::to_string(s.set.bytes_per_id()) +
               " bytes per id, host_pinned=" + (s.set.host_pinned() ? "True" : "False") + ")";
      });
}

}  // namespace gfd::python
