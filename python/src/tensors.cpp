// Tensors in through DLPack (torch, numpy, JAX, CuPy, ...), the CUDA array interface (Numba,
// CuPy, ...) or the array interface (numpy-like host arrays), for the Python module (declared in
// ext.hpp).
#include <cstdlib>
#include <memory>
#include <utility>

#include "ext.hpp"

namespace gfd::python {

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
  if (t.strides != nullptr)
    v.strides.assign(t.strides, t.strides + t.ndim);
  else
    compact_strides(v);
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
    owner->versioned = static_cast<dlpack::ManagedTensorVersioned*>(
        PyCapsule_GetPointer(cap, "dltensor_versioned"));
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
  if (ts[0] == '>' && bytes > 1)
    bad_argument(name + ": big-endian data (" + ts + ") is not supported");
  const auto bits = static_cast<std::uint8_t>(bytes * 8);
  switch (kind) {
    case 'i':
      return {dlpack::kInt, bits, 1};
    case 'u':
      return {dlpack::kUInt, bits, 1};
    case 'f':
      return {dlpack::kFloat, bits, 1};
    case 'b':
      return {dlpack::kBool, bits, 1};
    case 'V':
      return {dlpack::kUInt, 8, static_cast<std::uint16_t>(bytes)};  // opaque bytes
    default:
      bad_argument(name + ": typestr '" + ts + "' is not a type gfd moves");
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

TensorView tensor_view(py::handle obj, const std::string& name,
                       std::optional<std::uintptr_t> stream,
                       const std::function<void(std::uintptr_t)>& sync_to) {
  if (py::hasattr(obj, "__dlpack__") && py::hasattr(obj, "__dlpack_device__")) {
    // A read-only numpy array refuses DLPack export; its array interface still works.
    const bool other =
        py::hasattr(obj, "__array_interface__") || py::hasattr(obj, "__cuda_array_interface__");
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
  bad_argument(name +
               ": expected a tensor (an object with __dlpack__, __cuda_array_interface__ or "
               "__array_interface__), got " +
               type_name(obj));
}

std::string device_text(const TensorView& v) {
  switch (v.device_type) {
    case dlpack::kCPU:
      return "cpu";
    case dlpack::kCUDAHost:
      return "cpu (pinned)";
    case dlpack::kCUDA:
      return v.device_id >= 0 ? "cuda:" + std::to_string(v.device_id) : "cuda";
    case dlpack::kCUDAManaged:
      return "cuda (managed memory)";
    default:
      return "device type " + std::to_string(v.device_type);
  }
}

}  // namespace gfd::python
