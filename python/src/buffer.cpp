// gfd.Buffer (buffer.hpp): typed views of memory gfd owns, exported through DLPack and, on the
// host, the array interface.
#include "buffer.hpp"

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

py::object buffer_dlpack(const Buffer& b, py::object stream, py::object max_version,
                         py::object dl_device, py::object copy) {
  (void)stream;  // the memory is ready: nothing is pending on any stream
  if (!copy.is_none() && copy.cast<bool>())
    throw py::buffer_error("gfd buffers are exported without copying");
  if (!dl_device.is_none()) {
    py::tuple d = dl_device;
    if (d[0].cast<int>() != b.device_type ||
        (b.device_type != dlpack::kCPU && d[1].cast<int>() != b.device_id))
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

void register_buffer(py::module_& m) {
  py::class_<Buffer>(m, "Buffer", R"doc(
A typed view of memory gfd owns: a pinned host pool (gfd.empty_pinned, HostPool.view) or, for
tests, device memory. torch.from_dlpack(buffer) and numpy.from_dlpack(buffer) wrap it without a
copy (numpy.asarray too, for host memory); the memory lives as long as the buffer or any tensor
made from it.)doc")
      .def("__dlpack__", &buffer_dlpack, py::kw_only(), py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(),
           py::arg("copy") = py::none(), "DLPack export (no copy).")
      .def(
          "__dlpack_device__",
          [](const Buffer& b) {
            return py::make_tuple(b.device_type, b.device_type == dlpack::kCPU ? 0 : b.device_id);
          },
          "(DLPack device type, device id): (1, 0) for host memory, (2, ordinal) for a GPU's.")
      .def_property_readonly(
          "__array_interface__",
          [](const Buffer& b) -> py::dict {
            if (!b.host_accessible)
              throw py::attribute_error("device memory has no __array_interface__");
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
      .def_property_readonly(
          "ptr", [](const Buffer& b) { return reinterpret_cast<std::uintptr_t>(b.data); },
          "Address of the first element.")
      .def_property_readonly(
          "shape", [](const Buffer& b) { return py::tuple(py::cast(b.shape)); },
          "Dimensions (a tuple).")
      .def_property_readonly(
          "dtype", [](const Buffer& b) { return std::string(b.dtype->name); },
          "Element type name ('float16', 'bfloat16', 'uint8', ...).")
      .def_property_readonly("itemsize", &Buffer::itemsize, "Bytes per element.")
      .def_readonly("nbytes", &Buffer::nbytes, "Bytes of the view.")
      .def_property_readonly(
          "is_host", [](const Buffer& b) { return b.device_type == dlpack::kCPU; },
          "True for host memory, False for device memory.")
      .def_property_readonly(
          "pool",
          [](const Buffer& b) -> py::object { return b.pool ? py::cast(b.pool) : py::none(); },
          "The HostPool behind a host buffer, or None.")
      .def("__repr__", [](const Buffer& b) {
        std::string s = "gfd.Buffer(shape=(";
        for (std::size_t i = 0; i < b.shape.size(); ++i)
          s += (i ? ", " : "") + std::to_string(b.shape[i]);
        if (b.shape.size() == 1) s += ",";
        s += "), dtype=" + std::string(b.dtype->name) + ", ";
        s += b.device_type == dlpack::kCPU ? std::string("host")
                                           : "cuda:" + std::to_string(b.device_id);
        if (b.pool)
          s += std::string(", hugepages=") + to_string(b.pool->hugepages()) +
               ", numa_node=" + std::to_string(b.pool->numa_node()) +
               ", registered=" + (b.pool->registered() ? "True" : "False");
        return s + ")";
      });
}

}  // namespace gfd::python
