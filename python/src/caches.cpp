// Cache sets from Python: tensors described to the engine once (register_tensors), transfers on
// them by block ids (copy_on_set), through the public Engine::register_caches / copy_blocks.
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

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
// compact (one contiguous range). Products of dimensions and strides are checked for overflow
// (a foreign array interface may describe any shape).
BlockArray block_array(const TensorView& v, const std::string& name) {
  if (v.shape.empty()) bad_argument(name + ": a cache needs a first (block) dimension; got a scalar");
  for (std::size_t i = 0; i < v.shape.size(); ++i)
    if (v.shape[i] < 0) bad_argument(name + ": dimension " + std::to_string(i) + " is negative");
  const std::size_t item = item_bytes(v.dtype, name);
  std::int64_t expect = 1;
  for (int i = static_cast<int>(v.shape.size()) - 1; i >= 1; --i) {
    if (v.shape[i] != 1 && v.strides[i] != expect)
      bad_argument(name + ": each block must be contiguous (dimensions 1.. of the cache compact, row-major); "
                          "dimension " + std::to_string(i) + " has stride " + std::to_string(v.strides[i]) +
                   ", expected " + std::to_string(expect));
    if (__builtin_mul_overflow(expect, v.shape[i], &expect))
      bad_argument(name + ": a block of this shape has more elements than an address space");
  }
  std::size_t block_bytes = 0, stride = 0;
  if (__builtin_mul_overflow(static_cast<std::size_t>(expect), item, &block_bytes))
    bad_argument(name + ": a block of this shape has more bytes than an address space");
  if (v.shape[0] > 1 && v.strides[0] < expect)
    bad_argument(name + ": blocks overlap or run backwards (stride of dimension 0 is " +
                 std::to_string(v.strides[0]) + " elements, a block has " + std::to_string(expect) + ")");
  if (v.shape[0] > 1 && __builtin_mul_overflow(static_cast<std::size_t>(v.strides[0]), item, &stride))
    bad_argument(name + ": the block stride has more bytes than an address space");
  BlockArray a;
  a.base = v.data;
  a.blocks = static_cast<std::size_t>(v.shape[0]);
  a.block_bytes = block_bytes;
  a.stride = v.shape[0] > 1 ? stride : block_bytes;
  return a;
}

// Ids as the engine reads them: 4- or 8-byte signed integers in place (the engine checks each
// against the caches and names it); anything else copied, each value checked against `limit`.
BlockIds block_ids(const IntArray& a, std::size_t limit, const std::string& what, std::vector<std::int64_t>& copy) {
  const std::size_t n = a.rows();
  if (a.is_signed && (a.itemsize == 8 || a.itemsize == 4) && a.storage.empty())
    return BlockIds(a.data, n, a.strides[0], static_cast<std::uint8_t>(a.itemsize));
  copy.resize(n);
  const std::uint64_t max = limit == 0 ? 0 : limit - 1;
  const std::string text = what + " " + std::to_string(limit) + " blocks";
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t v = 0;
    if (!a.raw(i, 0, v) || v > max) v = a.at(i, 0, max, text);  // throws, naming the element
    copy[i] = static_cast<std::int64_t>(v);
  }
  return BlockIds(copy.data(), n, 8, 8);
}

// The engine names the arrays of a set "pairs[p].host" / "pairs[p].device": Python's names are
// the tensors' ("host[3]", "device[0]").
Error renamed(const Error& e, const Names& host_names, const Names& device_names) {
  // A plain scan, not std::regex: with torch loaded in the process, the std::regex form of this
  // function crashed it (SIGSEGV) on an H100 machine when it renamed an overlap error.
  const std::string m = e.what();
  std::string out;
  std::size_t at = 0;
  for (std::size_t i = m.find("pairs["); i != std::string::npos; i = m.find("pairs[", i + 1)) {
    std::size_t j = i + 6, p = 0;
    const std::size_t digits = j;
    while (j < m.size() && m[j] >= '0' && m[j] <= '9' && j - digits < 18) p = p * 10 + static_cast<std::size_t>(m[j++] - '0');
    if (j == digits || m.compare(j, 2, "].") != 0) continue;
    j += 2;
    const bool host = m.compare(j, 4, "host") == 0;
    if (!host && m.compare(j, 6, "device") != 0) continue;
    out += m.substr(at, i - at);
    out += host ? name_of(host_names, p) : name_of(device_names, p);
    at = j + (host ? 4 : 6);
    i = at - 1;
  }
  out += m.substr(at);
  return Error(e.code(), out, e.block());
}

}  // namespace

Direction direction_arg(py::handle v, const std::string& name) {
  py::object value = py::reinterpret_borrow<py::object>(v);
  // gfd.Direction members are str enums: their value is the name.
  if (py::hasattr(v, "value") && !py::isinstance<py::str>(v)) value = v.attr("value");
  if (py::isinstance<py::str>(value)) {
    const std::string s = py::str(value);
    if (s == "to_device") return Direction::kToDevice;
    if (s == "to_host") return Direction::kToHost;
    bad_argument(name + ": '" + s + "' is not a direction (gfd.Direction.TO_DEVICE, gfd.Direction.TO_HOST, "
                        "'to_device' or 'to_host')");
  }
  bad_type(name + ": expected gfd.Direction.TO_DEVICE, gfd.Direction.TO_HOST, 'to_device' or 'to_host', got " +
           type_name(v));
}

std::shared_ptr<PyCacheSet> register_tensors(EngineHolder& h, const py::sequence& host, const py::sequence& device,
                                             const Names& host_names, const Names& device_names) {
  const std::string fn = "register_caches";
  const std::size_t pairs = host.size();
  if (device.size() != pairs)
    bad_argument(fn + ": " + std::to_string(pairs) + " host caches but " + std::to_string(device.size()) +
                 " device caches");
  if (pairs == 0) bad_argument(fn + ": host: no cache given");
  std::vector<CachePair> ps(pairs);
  for (std::size_t p = 0; p < pairs; ++p) {
    const std::string an = fn + ": " + name_of(host_names, p), bn = fn + ": " + name_of(device_names, p);
    // A set registered ahead reads only where the memory is and its shape; each transfer on it
    // is ordered on its caller's stream.
    TensorView a = tensor_view(host[p], an, std::nullopt, {});
    TensorView b = tensor_view(device[p], bn, std::nullopt, {});
    if (!a.host())
      bad_argument(an + " is on " + device_text(a) + "; the host caches must be in host memory");
    if (!b.cuda())
      bad_argument(bn + " is on " + device_text(b) + "; the device caches must be in device memory of GPU " +
                   std::to_string(h.ordinal));
    if (b.device_id >= 0 && b.device_id != h.ordinal)
      bad_argument(bn + " is on " + device_text(b) + ", but the engine serves GPU " + std::to_string(h.ordinal));
    if (!same_type(a.dtype, b.dtype))
      bad_argument(bn + " has dtype " + dtype_text(b.dtype) + ", " + name_of(host_names, p) + " " +
                   dtype_text(a.dtype));
    const BlockArray x = block_array(a, an), y = block_array(b, bn);
    if (x.block_bytes != y.block_bytes)
      bad_argument(fn + ": blocks of " + name_of(host_names, p) + " have " + std::to_string(x.block_bytes) +
                   " bytes, blocks of " + name_of(device_names, p) + " " + std::to_string(y.block_bytes) +
                   " (the shapes after the first dimension must match)");
    ps[p].host = x;
    ps[p].device = y;
  }
  auto out = std::make_shared<PyCacheSet>();
  out->pairs = pairs;
  out->engine = &h;
  try {
    py::gil_scoped_release nogil;
    KeepCurrentDevice keep;
    out->set = h.engine->register_caches(ps);
  } catch (const Error& e) {
    throw renamed(e, host_names, device_names);
  }
  return out;
}

namespace {

// The ids of a copy_blocks call, checked (1-D, as many of each, no more than the destination's
// `dst_limit` blocks) and read as the engine reads them (block_ids), against the fewest blocks
// the sets have per side.
struct CallIds {
  IntArray a, b;
  std::vector<std::int64_t> src_copy, dst_copy;
  BlockIds src, dst;
  std::size_t rows() const { return a.rows(); }
  // The id arrays stay alive with the transfer.
  void keep_in(PyTransfer& t) const {
    for (const IntArray* x : {&a, &b})
      if (x->owner) t.keep.append(x->owner);
  }
};

void read_ids(CallIds& c, py::handle src_ids, py::handle dst_ids, bool to_device, std::size_t src_limit,
              std::size_t dst_limit, const std::string& sides) {
  const std::string fn = "copy_blocks";
  c.a = int_array(src_ids, fn + ": src_ids", false);
  c.b = int_array(dst_ids, fn + ": dst_ids", false);
  if (c.a.ndim != 1) bad_argument(fn + ": src_ids must be 1-D, got " + std::to_string(c.a.ndim) + " dimensions");
  if (c.b.ndim != 1) bad_argument(fn + ": dst_ids must be 1-D, got " + std::to_string(c.b.ndim) + " dimensions");
  if (c.a.rows() != c.b.rows())
    bad_argument(fn + ": src_ids has " + std::to_string(c.a.rows()) + " ids, dst_ids " + std::to_string(c.b.rows()));
  const std::string src_side = sides + (to_device ? "host caches have" : "device caches have");
  const std::string dst_side = sides + (to_device ? "device caches have" : "host caches have");
  // Cheap first: a destination block is written at most once per transfer, so more ids than
  // destination blocks cannot be valid, whatever they are (no work in proportion to them).
  if (c.a.rows() > dst_limit)
    bad_argument(fn + ": dst_ids: " + std::to_string(c.a.rows()) + " ids, but " + dst_side + " " +
                 std::to_string(dst_limit) + " blocks (each is written at most once per transfer)");
  if (c.a.rows() == 0) return;
  c.src = block_ids(c.a, src_limit, src_side, c.src_copy);
  c.dst = block_ids(c.b, dst_limit, dst_side, c.dst_copy);
}

}  // namespace

std::unique_ptr<PyTransfer> copy_on_set(EngineHolder& h, const PyCacheSet& set, Direction dir, py::handle src_ids,
                                        py::handle dst_ids, cudaStream_t stream) {
  const bool to_device = dir == Direction::kToDevice;
  CallIds ids;
  read_ids(ids, src_ids, dst_ids, to_device, to_device ? set.set.host_blocks() : set.set.device_blocks(),
           to_device ? set.set.device_blocks() : set.set.host_blocks(), "the ");
  Transfer t;
  if (ids.rows() != 0) {
    try {
      py::gil_scoped_release nogil;
      t = h.engine->copy_blocks(set.set, dir, ids.src, ids.dst, stream);
    } catch (const Error& e) {
      throw Error(e.code(), std::string("copy_blocks: ") + e.what(), e.block());
    }
  }
  auto out = std::make_unique<PyTransfer>(std::move(t));
  ids.keep_in(*out);
  return out;
}

py::list copy_on_sets(EngineHolder& h, const std::vector<std::shared_ptr<PyCacheSet>>& sets, Direction dir,
                      py::handle src_ids, py::handle dst_ids, cudaStream_t stream, py::handle after_each) {
  if (sets.empty()) bad_argument("copy_blocks: caches: an empty list of CacheSets");
  const bool to_device = dir == Direction::kToDevice;
  std::size_t src_limit = SIZE_MAX, dst_limit = SIZE_MAX;
  std::vector<CacheSet> list;
  for (const auto& s : sets) {
    if (s->engine != &h) bad_argument("copy_blocks: caches: a CacheSet of another engine");
    list.push_back(s->set);
    src_limit = std::min(src_limit, to_device ? s->set.host_blocks() : s->set.device_blocks());
    dst_limit = std::min(dst_limit, to_device ? s->set.device_blocks() : s->set.host_blocks());
  }
  CallIds ids;
  read_ids(ids, src_ids, dst_ids, to_device, src_limit, dst_limit, "the smallest set's ");
  std::vector<Transfer> ts;
  std::exception_ptr raised;  // the first exception of after_each: later ones are not called
  if (ids.rows() != 0) {
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
    try {
      py::gil_scoped_release nogil;
      ts = h.engine->copy_blocks(list, dir, ids.src, ids.dst, stream, each);
    } catch (const Error& e) {
      throw Error(e.code(), std::string("copy_blocks: ") + e.what(), e.block());
    }
  }
  if (raised) std::rethrow_exception(raised);
  py::list out;
  for (auto& t : ts) {
    auto p = std::make_unique<PyTransfer>(std::move(t));
    ids.keep_in(*p);
    out.append(py::cast(std::move(p)));
  }
  return out;
}

}  // namespace gfd::python
