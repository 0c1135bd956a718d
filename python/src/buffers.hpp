// Buffers out: typed views of memory gfd owns (pinned host pools; device memory for testing),
// exported through DLPack and, on the host, the array interface (buffers.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device/device.hpp"
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

  std::size_t count() const {
    std::size_t n = 1;
    for (auto s : shape) n *= static_cast<std::size_t>(s);
    return n;
  }
  std::size_t itemsize() const { return std::size_t{dtype->dl.bits} / 8 * dtype->dl.lanes; }
  std::size_t nbytes() const { return count() * itemsize(); }
};

// Dimensions from an int or a sequence of ints (gfd.Error for a negative one).
std::vector<std::int64_t> shape_from(py::handle shape);
// A view of `shape` and `dtype` at byte `offset` of `pool` (gfd.Error when it does not fit).
Buffer pool_view(const std::shared_ptr<HostPool>& pool, py::handle shape, const std::string& dtype,
                 std::size_t offset);
// A pool of `bytes` for `device` (the GIL released while it is pinned); `on`: the emulated device.
std::shared_ptr<HostPool> make_pool(std::size_t bytes, int device, int numa_node, bool reg,
                                    std::shared_ptr<detail::Device> on);
// gfd._gfd._HostPool and gfd._gfd.Buffer.
void register_buffers(py::module_& m);

}  // namespace gfd::python
