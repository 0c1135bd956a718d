// gfd.CacheSet: a runtime's caches described to an engine once (Engine.register_caches), and the
// transfers on them by block ids (Engine.copy_blocks), through the public gfd::Engine calls.
#pragma once

#include <cuda_runtime_api.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "gfd/gfd.hpp"

namespace py = pybind11;

namespace gfd::python {

// The set and the tensors it describes, kept alive with it.
struct PyCacheSet {
  CacheSet set;
  std::size_t pairs = 0;
  std::vector<py::object> keep;
};

// Engine.register_caches(host, device): `host[i]` (one tensor or a list) mirrors `device[i]`, on
// `engine`'s GPU `ordinal`. Errors name the tensors as the caller passed them ("host[3]").
std::shared_ptr<PyCacheSet> register_caches(Engine& engine, int ordinal, py::handle host,
                                            py::handle device);

// Engine.copy_blocks(caches, direction, src_ids, dst_ids, stream, after_each): one Transfer, or
// a list of them where `caches` is a list of sets.
py::object copy_blocks(Engine& engine, py::handle caches, py::handle direction, py::handle src_ids,
                       py::handle dst_ids, cudaStream_t stream, py::handle after_each);

// gfd._gfd.CacheSet.
void register_cache_set(py::module_& m);

}  // namespace gfd::python
