// gfd.Buffer: a typed view of memory gfd owns (a pinned host pool; device memory for testing),
// exported through DLPack and, on the host, the array interface (buffer.cpp). Views of a pool
// are made in host_pool.cpp.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dlpack.hpp"
#include "ext.hpp"
#include "gfd/gfd.hpp"

namespace gfd::python {

struct Buffer {
  std::shared_ptr<void> owner;  // the pool or allocation; DLPack exports hold it too
  std::shared_ptr<HostPool> pool;
  std::byte* data = nullptr;
  std::vector<std::int64_t> shape;
  const DType* dtype = nullptr;
  int device_type = dlpack::kCPU;
  int device_id = 0;
  bool host_accessible = true;

  std::size_t itemsize() const { return std::size_t{dtype->dl.bits} / 8 * dtype->dl.lanes; }
  std::size_t nbytes = 0;  // checked when the shape is set (shape_bytes)
};

// Dimensions from an int or a sequence of ints (gfd.Error naming `name` for a negative one).
std::vector<std::int64_t> shape_from(py::handle shape, const std::string& name);
// Bytes of `shape` elements of `itemsize` bytes, checked for overflow (gfd.Error naming `name`).
std::size_t shape_bytes(const std::vector<std::int64_t>& shape, std::size_t itemsize,
                        const std::string& name);
// A view of `shape` and `dtype` at byte `offset` of `pool` (gfd.Error, naming `fn`, when it does
// not fit).
Buffer pool_view(const std::shared_ptr<HostPool>& pool, py::handle shape, const DType& dtype,
                 py::handle offset, const std::string& fn);
// gfd._gfd.Buffer.
void register_buffer(py::module_& m);
// gfd._gfd.HostPool and empty_pinned.
void register_host_pool(py::module_& m);

}  // namespace gfd::python
