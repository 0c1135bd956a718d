// gfd.Transfer: the handle of one submitted transfer, holding the Python objects it moves (tensors,
// index arrays, cache sets) until it is done, even when the handle is dropped first.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gfd/gfd.hpp"

namespace py = pybind11;

namespace gfd::python {

class PyTransfer {
 public:
  PyTransfer(Transfer t, std::vector<py::object> keep) : t_(std::move(t)), keep_(std::move(keep)) {}
  // Runs with the GIL held (the handle is a Python object): an unfinished transfer's objects are
  // handed to the orphans, to be let go once it is done.
  ~PyTransfer();
  PyTransfer(const PyTransfer&) = delete;
  PyTransfer& operator=(const PyTransfer&) = delete;

  // True once every byte is in place (or the transfer failed). Never blocks.
  bool done();
  // True once done, False when `timeout` seconds (None: no limit) passed first; raises the
  // transfer's gfd.Error. The GIL is released meanwhile.
  bool wait(py::handle timeout);
  // The failure as a gfd.Error, or None; blocks like wait().
  py::object error();
  std::uint64_t bytes() const { return t_.bytes(); }
  std::string repr() const;

 private:
  void release();  // the objects go once the transfer is done
  Transfer t_;
  std::vector<py::object> keep_;
};

// Lets go of the objects of done transfers whose handles are gone (each submission calls it).
void prune_orphans();
// Lets go of every orphan (at exit, once the engines are closed).
void drop_orphans();

// gfd._gfd.Transfer.
void register_transfer(py::module_& m);

}  // namespace gfd::python
