// Buffers out (buffers.hpp): typed views of memory gfd owns, exported through DLPack and, on the
// host, the array interface; and the Python classes _HostPool and Buffer.
#include "buffers.hpp"

#include <pybind11/stl.h>

#include <utility>


namespace gfd::python {
namespace {


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

}  // namespace

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

std::size_t shape_bytes(const std::vector<std::int64_t>& shape, std::size_t itemsize, const std::string& name) {
  std::size_t n = itemsize;
  for (const std::int64_t d : shape)
    if (__builtin_mul_overflow(n, static_cast<std::size_t>(d), &n))
      bad_argument(name + ": the shape has more bytes than an address space");
  return n;
}

Buffer pool_view(const std::shared_ptr<HostPool>& pool, py::handle shape, const std::string& dtype,
                 py::handle offset_arg, const std::string& fn) {
  Buffer b;
  b.shape = shape_from(shape, fn + ": shape");
  b.dtype = &dtype_named(dtype);
  b.nbytes = shape_bytes(b.shape, b.itemsize(), fn + ": shape");
  b.pool = pool;
  b.owner = pool;
  const std::uint64_t offset = uint_arg(offset_arg, fn + ": offset");
  if (offset % b.itemsize() != 0)
    bad_argument(fn + ": offset: " + std::to_string(offset) + " is not a multiple of the element size " +
                 std::to_string(b.itemsize()));
  if (offset > pool->bytes() || b.nbytes > pool->bytes() - offset)
    bad_argument(fn + ": shape: " + std::to_string(b.nbytes) + " bytes at offset " + std::to_string(offset) +
                 " do not fit in the pool's " + std::to_string(pool->bytes()) + " bytes");
  b.data = pool->data() + offset;
  return b;
}

void register_buffers(py::module_& m) {
  py::class_<HostPool, std::shared_ptr<HostPool>>(m, "_HostPool")
      .def(py::init([](py::handle bytes, py::handle device, py::handle numa_node, py::handle reg) {
             // No pool is larger than the address space: checked before the 2 MiB rounding.
             HostPoolOptions o;
             o.bytes = static_cast<std::size_t>(uint_arg(bytes, "HostPool: bytes", host_address_end() / 2));
             if (o.bytes == 0) bad_argument("HostPool: bytes: must be at least 1");
             o.device = static_cast<int>(int_arg(device, "HostPool: device", -1, INT32_MAX));
             o.numa_node = static_cast<int>(int_arg(numa_node, "HostPool: numa_node", -2, INT32_MAX));
             if (!PyBool_Check(reg.ptr())) bad_type("HostPool: register: expected a bool, got " + type_name(reg));
             o.register_memory = reg.ptr() == Py_True;
             py::gil_scoped_release nogil;  // pinning takes a while for a large pool
             return std::make_shared<HostPool>(o);
           }),
           py::arg("bytes"), py::arg("device"), py::arg("numa_node"), py::arg("register"))
      .def_property_readonly("data", [](const HostPool& p) { return reinterpret_cast<std::uintptr_t>(p.data()); })
      .def_property_readonly("bytes", &HostPool::bytes)
      .def_property_readonly("hugepages", [](const HostPool& p) { return std::string(to_string(p.hugepages())); })
      .def_property_readonly("numa_node", &HostPool::numa_node)
      .def_property_readonly("registered", &HostPool::registered)
      .def_property_readonly("device", &HostPool::device)
      .def("view", [](const std::shared_ptr<HostPool>& p, py::handle shape, const std::string& dtype,
                      py::handle offset) { return pool_view(p, shape, dtype, offset, "view"); },
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
      .def_readonly("nbytes", &Buffer::nbytes, "Bytes of the view.")
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

}

}  // namespace gfd::python
