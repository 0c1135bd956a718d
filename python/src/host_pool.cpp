// gfd.HostPool and gfd.empty_pinned: pinned host memory for a runtime's KV pool, and typed views
// of it (gfd.Buffer, buffer.cpp).
#include <pybind11/stl.h>

#include <algorithm>

#include "buffer.hpp"

namespace gfd::python {

std::vector<std::int64_t> shape_from(py::handle shape, const std::string& name) {
  std::vector<std::int64_t> out;
  if (PyLong_Check(shape.ptr()) || PyBool_Check(shape.ptr()) || PyFloat_Check(shape.ptr())) {
    out.push_back(int_arg(shape, name, 0, INT64_MAX));
    return out;
  }
  if (shape.is_none() || py::isinstance<py::str>(shape) || !PySequence_Check(shape.ptr()))
    bad_type(name + ": expected an int or a sequence of ints, got " + type_name(shape));
  const py::sequence seq = py::reinterpret_borrow<py::sequence>(shape);
  const std::size_t n = seq.size();
  if (n > 32) bad_argument(name + ": " + std::to_string(n) + " dimensions (at most 32)");
  for (std::size_t i = 0; i < n; ++i)
    out.push_back(int_arg(seq[i], name + "[" + std::to_string(i) + "]", 0, INT64_MAX));
  return out;
}

std::size_t shape_bytes(const std::vector<std::int64_t>& shape, std::size_t itemsize,
                        const std::string& name) {
  std::size_t n = itemsize;
  for (const std::int64_t d : shape)
    if (__builtin_mul_overflow(n, static_cast<std::size_t>(d), &n))
      bad_argument(name + ": the shape has more bytes than an address space");
  return n;
}

Buffer pool_view(const std::shared_ptr<HostPool>& pool, py::handle shape, const DType& dtype,
                 py::handle offset_arg, const std::string& fn) {
  Buffer b;
  b.shape = shape_from(shape, fn + ": shape");
  b.dtype = &dtype;
  b.nbytes = shape_bytes(b.shape, b.itemsize(), fn + ": shape");
  b.pool = pool;
  b.owner = pool;
  const std::uint64_t offset = uint_arg(offset_arg, fn + ": offset");
  if (offset % b.itemsize() != 0)
    bad_argument(fn + ": offset: " + std::to_string(offset) +
                 " is not a multiple of the element size " + std::to_string(b.itemsize()));
  if (offset > pool->bytes() || b.nbytes > pool->bytes() - offset)
    bad_argument(fn + ": shape: " + std::to_string(b.nbytes) + " bytes at offset " +
                 std::to_string(offset) + " do not fit in the pool's " +
                 std::to_string(pool->bytes()) + " bytes");
  b.data = pool->data() + offset;
  return b;
}

namespace {

std::shared_ptr<HostPool> make_pool(py::handle bytes, py::handle device, py::handle numa_node,
                                    py::handle reg, const std::string& fn) {
  // No pool is larger than the address space: checked before the 2 MiB rounding.
  HostPoolOptions o;
  o.bytes = static_cast<std::size_t>(uint_arg(bytes, fn + ": bytes", host_address_end() / 2));
  if (o.bytes == 0) bad_argument(fn + ": bytes: must be at least 1");
  o.device = static_cast<int>(int_arg(device, fn + ": device", -1, INT32_MAX));
  o.numa_node = static_cast<int>(int_arg(numa_node, fn + ": numa_node", -2, INT32_MAX));
  if (!bool_like(reg)) bad_type(fn + ": register: expected a bool, got " + type_name(reg));
  o.register_memory = PyObject_IsTrue(reg.ptr()) == 1;
  py::gil_scoped_release nogil;  // pinning takes a while for a large pool
  return std::make_shared<HostPool>(o);
}

// The most bytes empty_pinned takes (a host pool's memory is mapped and pinned at once).
constexpr std::uint64_t kMostPinned = std::uint64_t{1} << 46;

}  // namespace

void register_host_pool(py::module_& m) {
  py::class_<HostPool, std::shared_ptr<HostPool>>(m, "HostPool", py::dynamic_attr(), R"doc(
Pinned host memory for a runtime's KV pool, placed where the gather path reads it fastest: huge
pages where the system gives them (reserved hugetlb pages, else transparent huge pages, else
ordinary pages), bound to the GPU's NUMA node, registered with CUDA (portable: every GPU of the
process, and so several engines, can use it). ``bytes`` is rounded up to 2 MiB.

``device``: the GPU whose NUMA node the memory goes on (-1: none). ``numa_node``: -1 = that GPU's
node, >= 0 = this node, -2 = no binding. ``register=False`` gives pageable memory with the same
pages and placement (no GPU needed).

:meth:`view` makes typed buffers of it; the pool's memory lives as long as the pool or any buffer
or tensor made from it.)doc")
      .def(py::init([](py::handle bytes, py::handle device, py::handle numa_node, py::handle reg) {
             return make_pool(bytes, device, numa_node, reg, "HostPool");
           }),
           py::arg("bytes"), py::arg("device") = 0, py::arg("numa_node") = -1,
           py::arg("register") = true)
      .def_property_readonly(
          "data", [](const HostPool& p) { return reinterpret_cast<std::uintptr_t>(p.data()); },
          "Address of the first byte (2 MiB aligned).")
      .def_property_readonly("bytes", &HostPool::bytes,
                             "Usable bytes (the requested size rounded up to 2 MiB).")
      .def_property_readonly(
          "hugepages", [](const HostPool& p) { return std::string(to_string(p.hugepages())); },
          "'hugetlb', 'transparent' or 'none': the pages behind the pool.")
      .def_property_readonly("numa_node", &HostPool::numa_node,
                             "The node the memory is bound to, or -1.")
      .def_property_readonly("registered", &HostPool::registered,
                             "Whether the pool is registered with CUDA (page-locked).")
      .def_property_readonly("device", &HostPool::device)
      .def(
          "view",
          [](const std::shared_ptr<HostPool>& p, py::handle shape, py::handle dtype,
             py::handle offset) {
            return pool_view(p, shape, dtype_arg(dtype, "view: dtype"), offset, "view");
          },
          py::arg("shape"), py::arg("dtype") = "uint8", py::arg("offset") = 0, R"doc(
A :class:`gfd.Buffer` of ``shape`` and ``dtype`` at byte ``offset`` of the pool (compact,
row-major); ``torch.from_dlpack`` or ``numpy.asarray`` turn it into a tensor or array sharing the
memory.)doc")
      .def("__repr__", [](const HostPool& p) {
        return "gfd.HostPool(" + std::to_string(p.bytes()) + " bytes, hugepages='" +
               to_string(p.hugepages()) + "', numa_node=" + std::to_string(p.numa_node()) +
               ", registered=" + (p.registered() ? "True" : "False") + ")";
      });

  m.def(
      "empty_pinned",
      [](py::handle shape, py::handle dtype, py::handle device, py::handle numa_node) {
        const DType& t = dtype_arg(dtype, "empty_pinned: dtype");
        const std::vector<std::int64_t> dims = shape_from(shape, "empty_pinned: shape");
        // Exact for any shape: a zero dimension makes it empty, else the product stops once too
        // large.
        std::uint64_t n =
            std::find(dims.begin(), dims.end(), 0) != dims.end() ? 0 : t.dl.bits / 8 * t.dl.lanes;
        for (const std::int64_t d : dims)
          if (n != 0 &&
              (__builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n) || n > kMostPinned))
            bad_argument("empty_pinned: shape: more than the " + std::to_string(kMostPinned) +
                         " bytes a host pool takes");
        auto pool = make_pool(py::int_(std::max<std::uint64_t>(n, 1)), device, numa_node,
                              py::bool_(true), "empty_pinned");
        return pool_view(pool, py::cast(dims), t, py::int_(0), "empty_pinned");
      },
      py::arg("shape"), py::arg("dtype") = "uint8", py::arg("device") = 0,
      py::arg("numa_node") = -1, R"doc(
An uninitialised (in fact zero-filled) pinned host array of ``shape`` and ``dtype`` in a
:class:`HostPool` of its own (huge pages, the GPU's NUMA node, registered with CUDA).

Returns a :class:`gfd.Buffer`; ``torch.from_dlpack(buf)`` gives a CPU tensor on it (pinned:
``is_pinned()`` is True), ``numpy.asarray(buf)`` a numpy array. The memory lives as long as any of
them. ``dtype``: a torch or numpy dtype or its name ('float16', 'bfloat16', ...).)doc");
}

}  // namespace gfd::python
