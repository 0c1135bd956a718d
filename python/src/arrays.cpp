// Integer arrays in (pointers, sizes, block ids), for the Python module (declared in ext.hpp).
// Tensors in: tensors.cpp.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "ext.hpp"

namespace gfd::python {

// ---------------------------------------------------------------------------------------------
// Integer arrays in (pointers, sizes, block ids): numpy and other buffers, DLPack (torch CPU
// tensors), the array interface, or Python sequences. Values are read in place where possible.

namespace {

void int_type(IntArray& a, dlpack::DataType t, const std::string& name) {
  if ((t.code != dlpack::kInt && t.code != dlpack::kUInt) || t.lanes != 1 ||
      (t.bits != 8 && t.bits != 16 && t.bits != 32 && t.bits != 64))
    bad_type(name + ": " + dtype_text(t) +
             " is not an integer type (ids, sizes and pointers are integers)");
  a.itemsize = t.bits / 8;
  a.is_signed = t.code == dlpack::kInt;
}

void int_shape(IntArray& a, const std::vector<std::int64_t>& shape,
               const std::vector<std::int64_t>& strides_bytes, const std::string& name) {
  if (shape.empty() || shape.size() > 2)
    bad_argument(name + ": expected a 1-D or 2-D integer array, got " +
                 std::to_string(shape.size()) + " dimensions");
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

std::uint64_t IntArray::at(std::size_t i, std::size_t j, std::uint64_t max,
                           const std::string& limit) const {
  std::uint64_t v = 0;
  const std::size_t r = scalar ? 0 : i;
  if (!raw(r, j, v))
    bad_argument(
        element(r, j) + ": " + std::to_string(static_cast<std::int64_t>(v)) + " is negative", i);
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

IntArray int_array(py::handle obj, const std::string& name, bool allow_scalar, bool signed_values) {
  IntArray a;
  a.name = name;
  // A single integer (sizes: one for every block).
  if (PyLong_Check(obj.ptr()) || PyBool_Check(obj.ptr()) || PyFloat_Check(obj.ptr())) {
    if (!allow_scalar)
      bad_type(name + ": expected an array of integers (numpy array, CPU tensor or list), got " +
               type_name(obj));
    const IntValue v = int_value(obj, name);
    if (v.negative) bad_argument(name + ": " + v.text() + " is negative");
    if (v.huge) bad_argument(name + ": " + v.text() + " is out of range");
    a.scalar = true;
    a.storage.push_back(v.magnitude);
    a.data = reinterpret_cast<const std::byte*>(a.storage.data());
    a.shape[0] = 1;
    return a;
  }
  if (obj.is_none() || py::isinstance<py::str>(obj) || py::isinstance<py::bytes>(obj) ||
      PyDict_Check(obj.ptr()))
    bad_type(name + ": expected an array of integers (numpy array, CPU tensor or list), got " +
             type_name(obj));
  // Buffers (numpy arrays, array.array): read in place.
  if (PyObject_CheckBuffer(obj.ptr())) {
    auto view = std::shared_ptr<Py_buffer>(new Py_buffer, [](Py_buffer* b) {
      PyBuffer_Release(b);
      delete b;
    });
    if (PyObject_GetBuffer(obj.ptr(), view.get(), PyBUF_STRIDES | PyBUF_FORMAT) == 0) {
      std::string fmt = view->format != nullptr ? view->format : "B";
      if (!fmt.empty() &&
          (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@' || fmt[0] == '!' || fmt[0] == '>')) {
        if ((fmt[0] == '>' || fmt[0] == '!') && view->itemsize > 1)
          bad_argument(name + ": big-endian integers are not supported");
        fmt = fmt.substr(1);
      }
      const std::string ints = "bBhHiIlLqQnN";
      if (fmt.size() != 1 || ints.find(fmt[0]) == std::string::npos)
        bad_type(name + ": " + format_text(fmt) +
                 " is not an integer type (ids, sizes and pointers are integers)");
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
  // Lists and tuples are not looked at as tensors or arrays below, where each failed attribute
  // lookup would cost an AttributeError.
  const bool plain_sequence = PyList_CheckExact(obj.ptr()) || PyTuple_CheckExact(obj.ptr());
  // A torch CPU tensor (a block mapping, say) as its numpy view, read as a buffer: a DLPack
  // export costs several microseconds of Python (torch's __dlpack__), the view about one. What
  // torch will not view so (CUDA tensors, tensors that need grad, bfloat16) takes the DLPack path
  // below, with its messages.
  if (!plain_sequence && is_torch_tensor(obj)) {
    static PyObject* const numpy_name = PyUnicode_InternFromString("numpy");
    if (PyObject* view = PyObject_CallMethodNoArgs(obj.ptr(), numpy_name)) {
      const py::object keep = py::reinterpret_steal<py::object>(view);
      if (PyObject_CheckBuffer(view)) {
        IntArray out = int_array(keep, name, allow_scalar, signed_values);
        out.owner = keep;
        return out;
      }
    } else {
      PyErr_Clear();
    }
  }
  // DLPack (torch CPU tensors) and the array interface.
  if (!plain_sequence &&
      ((py::hasattr(obj, "__dlpack__") && py::hasattr(obj, "__dlpack_device__")) ||
       py::hasattr(obj, "__array_interface__") || py::hasattr(obj, "__cuda_array_interface__"))) {
    TensorView v = tensor_view(obj, name, std::nullopt, {});
    if (!v.host())
      bad_argument(name + ": must be in host memory (a CPU array or tensor), not on " +
                   device_text(v));
    if (v.dtype.code == dlpack::kBool || v.dtype.code == dlpack::kFloat ||
        v.dtype.code == dlpack::kBfloat)
      bad_type(name + ": " + dtype_text(v.dtype) +
               " is not an integer type (ids, sizes and pointers are integers)");
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
    bad_type(name + ": expected an array of integers (numpy array, CPU tensor or list), got " +
             type_name(obj));
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  const std::size_t n = seq.size();
  int cols = 0;  // 0: 1-D
  a.storage.reserve(n);
  auto take = [&](py::handle x, std::size_t i, std::size_t j) {
    // A plain int in range, the common case, without the element's name (made only for a
    // message): a list of thousands of ids otherwise costs a string per id.
    if (PyLong_CheckExact(x.ptr())) {
      int overflow = 0;
      const long long s = PyLong_AsLongLongAndOverflow(x.ptr(), &overflow);
      if (overflow == 0 && (s >= 0 || signed_values)) {
        a.storage.push_back(static_cast<std::uint64_t>(s));  // two's complement where negative
        return;
      }
    }
    const std::string at =
        name + "[" + std::to_string(i) + "]" + (cols ? "[" + std::to_string(j) + "]" : "");
    const IntValue v = int_value(x, at);
    if (signed_values) {
      if (v.huge || v.magnitude > (v.negative ? std::uint64_t{1} << 63 : std::uint64_t{INT64_MAX}))
        bad_argument(at + ": " + v.text() + " is out of range (ids are 64-bit signed integers)", i);
      a.storage.push_back(v.negative ? 0 - v.magnitude : v.magnitude);  // two's complement
      return;
    }
    if (v.negative) bad_argument(at + ": " + v.text() + " is negative", i);
    if (v.huge) bad_argument(at + ": " + v.text() + " is out of range", i);
    a.storage.push_back(v.magnitude);
  };
  for (std::size_t i = 0; i < n; ++i) {
    py::object x = seq[i];
    const bool pair = PySequence_Check(x.ptr()) && !py::isinstance<py::str>(x) &&
                      !PyLong_Check(x.ptr()) && !py::hasattr(x, "__index__");
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
  a.is_signed = signed_values;
  a.data = reinterpret_cast<const std::byte*>(a.storage.data());
  a.ndim = cols ? 2 : 1;
  a.shape[0] = static_cast<std::int64_t>(n);
  a.shape[1] = cols ? cols : 1;
  a.strides[0] = 8 * std::max(cols, 1);
  a.strides[1] = 8;
  return a;
}

BlockIds block_ids(const IntArray& a, std::vector<std::int64_t>& copy) {
  const std::size_t n = a.rows();
  auto fits = [&](std::uint64_t max) {  // every value of an unsigned array at most `max`
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) {
      (void)a.raw(i, 0, v);
      if (v > max) return false;
    }
    return true;
  };
  // 4- and 8-byte arrays are read in place (unsigned ones as signed, where every value is the
  // same number either way): no buffer of the call's size is made, even for a call the engine
  // rejects.
  if ((a.itemsize == 8 || a.itemsize == 4) && a.storage.empty() &&
      (a.is_signed || fits(a.itemsize == 8 ? INT64_MAX : INT32_MAX)))
    return BlockIds(a.data, n, a.strides[0], static_cast<std::uint8_t>(a.itemsize));
  if (a.is_signed && a.itemsize == 8)
    return BlockIds(a.data, n, a.strides[0], 8);  // a sequence's values
  copy.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t v = 0;
    const bool non_negative = a.raw(i, 0, v);
    if (non_negative && v > static_cast<std::uint64_t>(INT64_MAX))
      bad_argument(a.element(i, 0) + ": " + std::to_string(v) +
                       " is out of range (ids are 64-bit signed integers)",
                   i);
    copy[i] = static_cast<std::int64_t>(v);
  }
  return BlockIds(copy.data(), n, 8, 8);
}

}  // namespace gfd::python
