// gfd.Error and its subclasses for the Python module (declared in ext.hpp): the classes, the
// translation of gfd::Error into them, and the helpers every binding file raises them with.
#include "ext.hpp"

namespace gfd::python {

// ---------------------------------------------------------------------------------------------
// Errors: one Python exception class, gfd.Error(RuntimeError), with .code and .block.

namespace {
PyObject* g_error_type = nullptr;     // gfd.Error
PyObject* g_argument_type = nullptr;  // gfd.InvalidArgument
PyObject* g_type_type = nullptr;      // gfd.InvalidType

PyObject* new_class(const char* name, const char* doc, PyObject* bases, const py::dict& attrs) {
  PyObject* t = PyErr_NewExceptionWithDoc(name, doc, bases, attrs.ptr());
  if (t == nullptr) throw py::error_already_set();
  return t;
}
}  // namespace

[[noreturn]] void bad_argument(const std::string& message, std::uint64_t block) {
  throw Error(ErrorCode::kInvalidArgument, message, static_cast<std::size_t>(block));
}

[[noreturn]] void bad_type(const std::string& message) { throw TypeArgError(message); }

py::object make_error(const Error& e) {
  PyObject* cls = g_error_type;
  if (dynamic_cast<const TypeArgError*>(&e) != nullptr)
    cls = g_type_type;
  else if (e.code() == ErrorCode::kInvalidArgument)
    cls = g_argument_type;
  py::object type = py::reinterpret_borrow<py::object>(cls);
  py::object exc = type(py::str(e.what()));
  exc.attr("code") = py::str(to_string(e.code()));
  exc.attr("block") = e.block() == kNoBlock ? py::none() : py::object(py::int_(e.block()));
  return exc;
}

void register_error_type(py::module_& m) {
  py::dict error_defaults;  // class attributes: instances made in Python read these
  error_defaults["code"] = py::str("invalid_argument");
  error_defaults["block"] = py::none();
  g_error_type = new_class(
      "gfd.Error",
      "Every error gfd raises. `code` names the kind ('invalid_argument', 'cuda', 'system', "
      "'shutdown', 'no_device', ...); `block` is the index of the offending block or id row, or "
      "None. The message names the call and the argument.",
      PyExc_RuntimeError, error_defaults);
  py::dict none;
  PyObject* bases = PyTuple_Pack(2, g_error_type, PyExc_ValueError);
  g_argument_type = new_class(
      "gfd.InvalidArgument",
      "A bad argument (code 'invalid_argument'): a gfd.Error and a ValueError. Raised before "
      "anything is written.",
      bases, none);
  Py_DECREF(bases);
  bases = PyTuple_Pack(2, g_argument_type, PyExc_TypeError);
  g_type_type = new_class(
      "gfd.InvalidType",
      "An argument of the wrong type (a float or bool where an integer is taken, None where a "
      "list is): a gfd.InvalidArgument and a TypeError.",
      bases, none);
  Py_DECREF(bases);
  m.attr("Error") = py::handle(g_error_type);
  m.attr("InvalidArgument") = py::handle(g_argument_type);
  m.attr("InvalidType") = py::handle(g_type_type);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      py::object exc = make_error(e);
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    } catch (const py::cast_error& e) {
      // pybind11's conversions of the few typed parameters left (str, sequences): an argument
      // of the wrong type. The Python wrappers name the argument before this can happen.
      py::object exc = make_error(TypeArgError(std::string("gfd: ") + e.what()));
      PyErr_SetObject(g_type_type, exc.ptr());
    }
  });
}

// The Python exception for a stored failure (Transfer.error()).
py::object error_object(const std::exception_ptr& p) {
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    return make_error(e);
  } catch (const std::exception& e) {
    return make_error(Error(ErrorCode::kSystem, e.what()));
  }
}

std::string type_name(py::handle v) {
  py::handle t = py::type::of(v);
  const std::string name = py::str(t.attr("__name__"));
  const std::string module =
      py::hasattr(t, "__module__") ? std::string(py::str(t.attr("__module__"))) : "";
  if (module.empty() || module == "builtins") return name;
  return module + "." + name;
}

bool bool_like(py::handle v) {
  if (PyBool_Check(v.ptr())) return true;
  const std::string t = type_name(v);
  return t == "numpy.bool_" || t == "numpy.bool";
}

}  // namespace gfd::python
