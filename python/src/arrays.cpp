// Tensors in through DLPack and the array interfaces, and integer arrays (pointers, sizes, block
// ids), for the Python module (declared in ext.hpp).
#include "ext.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace gfd::python {

// ---------------------------------------------------------------------------------------------
// Tensors in: DLPack (torch, numpy, JAX, CuPy, ...), the CUDA array interface (Numba, CuPy, ...)
// or the array interface (numpy-like host arrays).

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
  if (t.strides != nullptr) v.strides.assign(t.strides, t.strides + t.ndim);
  else compact_strides(v);
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
    owner->versioned =
        static_cast<dlpack::ManagedTensorVersioned*>(PyCapsule_GetPointer(cap, "dltensor_versioned"));
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
  if (ts[0] == '>' && bytes > 1) bad_argument(name + ": big-endian data (" + ts + ") is not supported");
  const auto bits = static_cast<std::uint8_t>(bytes * 8);
  switch (kind) {
    case 'i': return {dlpack::kInt, bits, 1};
    case 'u': return {dlpack::kUInt, bits, 1};
    case 'f': return {dlpack::kFloat, bits, 1};
    case 'b': return {dlpack::kBool, bits, 1};
    case 'V': return {dlpack::kUInt, 8, static_cast<std::uint16_t>(bytes)};  // opaque bytes
    default: bad_argument(name + ": typestr '" + ts + "' is not a type gfd moves");
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

TensorView tensor_view(py::handle obj, const std::string& name, std::optional<std::uintptr_t> stream,
                       const std::function<void(std::uintptr_t)>& sync_to) {
  if (py::hasattr(obj, "__dlpack__") && py::hasattr(obj, "__dlpack_device__")) {
    // A read-only numpy array refuses DLPack export; its array interface still works.
    const bool other = py::hasattr(obj, "__array_interface__") || py::hasattr(obj, "__cuda_array_interface__");
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
  bad_argument(name + ": expected a tensor (an object with __dlpack__, __cuda_array_interface__ or "
                      "__array_interface__), got " + type_name(obj));
}

std::string device_text(const TensorView& v) {
  switch (v.device_type) {
    case dlpack::kCPU: return "cpu";
    case dlpack::kCUDAHost: return "cpu (pinned)";
    case dlpack::kCUDA: return v.device_id >= 0 ? "cuda:" + std::to_string(v.device_id) : "cuda";
    case dlpack::kCUDAManaged: return "cuda (managed memory)";
    default: return "device type " + std::to_string(v.device_type);
  }
}

// ---------------------------------------------------------------------------------------------
// Integer arrays in (pointers, sizes, block ids): numpy and other buffers, DLPack (torch CPU
// tensors), the array interface, or Python sequences. Values are read in place where possible.

namespace {

void int_type(IntArray& a, dlpack::DataType t, const std::string& name) {
  if ((t.code != dlpack::kInt && t.code != dlpack::kUInt) || t.lanes != 1 ||
      (t.bits != 8 && t.bits != 16 && t.bits != 32 && t.bits != 64))
    bad_type(name + ": " + dtype_text(t) + " is not an integer type (ids, sizes and pointers are integers)");
  a.itemsize = t.bits / 8;
  a.is_signed = t.code == dlpack::kInt;
}

void int_shape(IntArray& a, const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& strides_bytes,
               const std::string& name) {
  if (shape.empty() || shape.size() > 2)
    bad_argument(name + ": expected a 1-D or 2-D integer array, got " + std::to_string(shape.size()) + " dimensions");
  for (const std::int64_t d : shape)
    if (d < 0) bad_argument(name + ": a dimension of " + std::to_string(d) + " elements");
  a.ndim = static_cast<int>(shape.size());
  for (int i = 0; i < a.ndim; ++i) {
    a.shape[i] = shape[i];
    a.strides[i] = strides_bytes[i];
  }
}

}  // namespace

bool is_torch_tensor(py::handle obj) {
  // torch.Tensor, once torch is loaded (never imported here); kept for the process's life, as
  // torch is never unloaded.
  static PyObject* tensor_type = nullptr;
  if (tensor_type == nullptr) {
    static PyObject* const torch_name = PyUnicode_InternFromString("torch");
    PyObject* torch = PyImport_GetModule(torch_name);
    if (torch == nullptr) {
      PyErr_Clear();
      return false;
    }
    tensor_type = PyObject_GetAttrString(torch, "Tensor");
    Py_DECREF(torch);
    if (tensor_type == nullptr) {
      PyErr_Clear();
      return false;
    }
  }
  const int r = PyObject_IsInstance(obj.ptr(), tensor_type);
  if (r < 0) PyErr_Clear();
  return r > 0;
}

std::string IntArray::element(std::size_t i, std::size_t j) const {
  if (scalar) return name;
  return name + "[" + std::to_string(i) + "]" + (ndim == 2 ? "[" + std::to_string(j) + "]" : "");
}

std::uint64_t IntArray::at(std::size_t i, std::size_t j, std::uint64_t max, const std::string& limit) const {
  std::uint64_t v = 0;
  const std::size_t r = scalar ? 0 : i;
  if (!raw(r, j, v))
    bad_argument(element(r, j) + ": " + std::to_string(static_cast<std::int64_t>(v)) + " is negative", i);
  if (v > max)
    bad_argument(element(r, j) + ": " + std::to_string(v) + " is out of range (" +
                     (limit.empty() ? "at most " + std::to_string(max) : limit) + ")",
                 i);
  return v;
}

namespace {

// Array element types by name, for messages ("float32 is not an integer type").
std::string format_text(const std::string& fmt) {
  if (fmt == "?") return "bool";
  if (fmt == "e") return "float16";
  if (fmt == "f") return "float32";
  if (fmt == "d") return "float64";
  if (fmt == "g") return "longdouble";
  if (!fmt.empty() && fmt.back() == 'Z') return "complex";
  return "format '" + fmt + "'";
}

}  // namespace

IntArray int_array(py::handle obj, const std::string& name, bool allow_scalar) {
  IntArray a;
  a.name = name;
  // A single integer (sizes: one for every block).
  if (PyLong_Check(obj.ptr()) || PyBool_Check(obj.ptr()) || PyFloat_Check(obj.ptr())) {
    if (!allow_scalar)
      bad_type(name + ": expected an array of integers (numpy array, CPU tensor or list), got " + type_name(obj));
    const IntValue v = int_value(obj, name);
    if (v.negative) bad_argument(name + ": " + v.text() + " is negative");
    if (v.huge) bad_argument(name + ": " + v.text() + " is out of range");
    a.scalar = true;
    a.storage.push_back(v.magnitude);
    a.data = reinterpret_cast<const std::byte*>(a.storage.data());
    a.shape[0] = 1;
    return a;
  }
  if (obj.is_none() || py::isinstance<py::str>(obj) || py::isinstance<py::bytes>(obj) || PyDict_Check(obj.ptr()))
    bad_type(name + ": expected an array of integers (numpy array, CPU tensor or list), got " + type_name(obj));
  // Buffers (numpy arrays, array.array): read in place.
  if (PyObject_CheckBuffer(obj.ptr())) {
    auto view = std::shared_ptr<Py_buffer>(new Py_buffer, [](Py_buffer* b) {
      PyBuffer_Release(b);
      delete b;
    });
    if (PyObject_GetBuffer(obj.ptr(), view.get(), PyBUF_STRIDES | PyBUF_FORMAT) == 0) {
      std::string fmt = view->format != nullptr ? view->format : "B";
      if (!fmt.empty() && (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@' || fmt[0] == '!' || fmt[0] == '>')) {
        if ((fmt[0] == '>' || fmt[0] == '!') && view->itemsize > 1)
          bad_argument(name + ": big-endian integers are not supported");
        fmt = fmt.substr(1);
      }
      const std::string ints = "bBhHiIlLqQnN";
      if (fmt.size() != 1 || ints.find(fmt[0]) == std::string::npos)
        bad_type(name + ": " + format_text(fmt) + " is not an integer type (ids, sizes and pointers are integers)");
      if (view->itemsize != 1 && view->itemsize != 2 && view->itemsize != 4 && view->itemsize != 8)
        bad_type(name + ": " + std::to_string(view->itemsize) + "-byte integers are not supported");
      a.itemsize = static_cast<int>(view->itemsize);
      a.is_signed = std::islower(static_cast<unsigned char>(fmt[0])) != 0;
      std::vector<std::int64_t> shape(view->shape, view->shape + view->ndim);
      std::vector<std::int64_t> strides(view->strides, view->strides + view->ndim);
      int_shape(a, shape, strides, name);
      a.data = static_cast<const std::byte*>(view->buf);
      a.buffer = std::move(view);
      return a;
    }
    PyErr_Clear();
  }
  // A torch CPU tensor (a block mapping, say) as its numpy view, read as a buffer: a DLPack
  // export costs several microseconds of Python (torch's __dlpack__), the view about one. What
  // torch will not view so (CUDA tensors, tensors that need grad, bfloat16) takes the DLPack path
  // below, with its messages.
  if (is_torch_tensor(obj)) {
    static PyObject* const numpy_name = PyUnicode_InternFromString("numpy");
    if (PyObject* view = PyObject_CallMethodNoArgs(obj.ptr(), numpy_name)) {
      const py::object keep = py::reinterpret_steal<py::object>(view);
      if (PyObject_CheckBuffer(view)) {
        IntArray out = int_array(keep, name, allow_scalar);
        out.owner = keep;
        return out;
      }
    } else {
      PyErr_Clear();
    }
  }
  // DLPack (torch CPU tensors) and the array interface.
  if ((py::hasattr(obj, "__dlpack__") && py::hasattr(obj, "__dlpack_device__")) ||
      py::hasattr(obj, "__array_interface__") || py::hasattr(obj, "__cuda_array_interface__")) {
    TensorView v = tensor_view(obj, name, std::nullopt, {});
    if (!v.host())
      bad_argument(name + ": must be in host memory (a CPU array or tensor), not on " + device_text(v));
    if (v.dtype.code == dlpack::kBool || v.dtype.code == dlpack::kFloat || v.dtype.code == dlpack::kBfloat)
      bad_type(name + ": " + dtype_text(v.dtype) + " is not an integer type (ids, sizes and pointers are integers)");
    int_type(a, v.dtype, name);
    std::vector<std::int64_t> strides(v.strides.size());
    for (std::size_t i = 0; i < strides.size(); ++i) strides[i] = v.strides[i] * a.itemsize;
    int_shape(a, v.shape, strides, name);
    a.data = v.data;
    a.owner = std::move(v.owner);
    return a;
  }
  // Sequences (lists, tuples), 1-D or of rows of one length: every element an int, each
  // checked as it is read (a negative or too large one is reported at once, naming it).
  if (!PySequence_Check(obj.ptr()))
    bad_type(name + ": expected an array of integers (numpy array, CPU tensor or list), got " + type_name(obj));
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  const std::size_t n = seq.size();
  int cols = 0;  // 0: 1-D
  a.storage.reserve(n);
  auto take = [&](py::handle x, std::size_t i, std::size_t j) {
    const std::string at = name + "[" + std::to_string(i) + "]" + (cols ? "[" + std::to_string(j) + "]" : "");
    const IntValue v = int_value(x, at);
    if (v.negative) bad_argument(at + ": " + v.text() + " is negative", i);
    if (v.huge) bad_argument(at + ": " + v.text() + " is out of range", i);
    a.storage.push_back(v.magnitude);
  };
  for (std::size_t i = 0; i < n; ++i) {
    py::object x = seq[i];
    const bool pair = PySequence_Check(x.ptr()) && !py::isinstance<py::str>(x) && !PyLong_Check(x.ptr()) &&
                      !py::hasattr(x, "__index__");
    if (i == 0) {
      cols = pair ? static_cast<int>(py::len(x)) : 0;
      if (pair && cols == 0) bad_argument(name + "[0]: an empty row");
    }
    if (pair != (cols != 0) || (pair && static_cast<int>(py::len(x)) != cols))
      bad_argument(name + "[" + std::to_string(i) + "]: rows differ in shape", i);
    if (pair) {
      py::sequence row = py::reinterpret_borrow<py::sequence>(x);
      for (int j = 0; j < cols; ++j) take(row[j], i, j);
    } else {
      take(x, i, 0);
    }
  }
  a.itemsize = 8;
  a.is_signed = false;
  a.data = reinterpret_cast<const std::byte*>(a.storage.data());
  a.ndim = cols ? 2 : 1;
  a.shape[0] = static_cast<std::int64_t>(n);
  a.shape[1] = cols ? cols : 1;
  a.strides[0] = 8 * std::max(cols, 1);
  a.strides[1] = 8;
  return a;
}

}  // namespace gfd::python
