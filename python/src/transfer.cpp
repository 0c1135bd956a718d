// gfd.Transfer (transfer.hpp) and the orphans: objects of transfers whose handles went away
// before the transfer was done.
#include "transfer.hpp"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <optional>
#include <thread>
#include <utility>

#include "ext.hpp"

namespace gfd::python {
namespace {

struct Orphan {
  Transfer transfer;
  std::vector<py::object> keep;
};

// Touched with the GIL held only. Never destroyed: it may still hold Python objects when the
// process ends, and those must not be released after the interpreter is gone (drop_orphans
// empties it at exit).
std::vector<Orphan>& orphans() {
  static auto* v = new std::vector<Orphan>();
  return *v;
}

}  // namespace

PyTransfer::~PyTransfer() {
  if (!keep_.empty() && !t_.done()) orphans().push_back({t_, std::move(keep_)});
}

void PyTransfer::release() { std::vector<py::object>().swap(keep_); }

bool PyTransfer::done() {
  if (!t_.done()) return false;
  release();
  return true;
}

bool PyTransfer::wait(py::handle timeout) {
  std::optional<double> limit;
  if (!timeout.is_none()) {
    if (PyBool_Check(timeout.ptr()) ||
        !(PyFloat_Check(timeout.ptr()) || PyLong_Check(timeout.ptr())))
      bad_type("wait: timeout: expected seconds (a float or int) or None, got " +
               type_name(timeout));
    limit = PyFloat_AsDouble(timeout.ptr());
    if (PyErr_Occurred()) {
      PyErr_Clear();
      bad_argument("wait: timeout: out of range");
    }
  }
  try {
    py::gil_scoped_release nogil;
    if (limit) {
      const double s = std::min(std::max(0.0, *limit), 1e9);  // NaN and inf: no deadline overflow
      const auto deadline = std::chrono::steady_clock::now() +
                            std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(s == s ? s : 0.0));
      auto pause = std::chrono::microseconds(5);
      while (!t_.done()) {
        if (std::chrono::steady_clock::now() >= deadline) return false;
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(1000));
      }
    }
    t_.wait();
  } catch (...) {
    if (t_.done()) release();
    throw;
  }
  release();
  return true;
}

py::object PyTransfer::error() {
  std::exception_ptr e;
  {
    py::gil_scoped_release nogil;
    e = t_.error();
  }
  release();
  return e ? error_object(e) : py::none();
}

std::string PyTransfer::repr() const {
  return "gfd.Transfer(" + std::to_string(t_.bytes()) + " bytes, " +
         (t_.done() ? "done" : "in flight") + ")";
}

// The objects are released only once the list is consistent again: releasing one may run any
// Python code, which may drop another handle (and add an orphan).
void prune_orphans() {
  auto& v = orphans();
  if (v.empty()) return;
  const auto done =
      std::partition(v.begin(), v.end(), [](const Orphan& o) { return !o.transfer.done(); });
  std::vector<Orphan> gone(std::make_move_iterator(done), std::make_move_iterator(v.end()));
  v.erase(done, v.end());
}

void drop_orphans() {
  std::vector<Orphan> gone;
  gone.swap(orphans());
}

void register_transfer(py::module_& m) {
  py::class_<PyTransfer>(m, "Transfer", R"doc(
Handle of one submitted transfer.

It keeps the Python objects of the transfer (tensors, index arrays, cache sets) alive until the
transfer is done, so that their memory cannot be freed or reused while blocks are in flight,
even if this handle is dropped first.)doc")
      .def("done", &PyTransfer::done,
           "True once every byte is in place (or the transfer failed). Never blocks.")
      .def("wait", &PyTransfer::wait, py::arg("timeout") = py::none(), R"doc(
Blocks until the transfer is done (the GIL is released meanwhile).

Returns True when it is done, False if ``timeout`` seconds passed first. Raises the transfer's
:class:`gfd.Error` if it failed.)doc")
      .def("error", &PyTransfer::error,
           "The failure of the transfer as a gfd.Error, or None. Blocks like wait().")
      .def_property_readonly("bytes", &PyTransfer::bytes, "Payload bytes this transfer moves.")
      .def("__repr__", &PyTransfer::repr);
}

}  // namespace gfd::python
