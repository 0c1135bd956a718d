// gfd's Python module (gfd._gfd): engines, transfers and the testing hooks. Tensors and integer
// arrays come in through arrays.cpp, options and errors through convert.cpp (both declared in
// ext.hpp), cache sets through caches.cpp, pinned host pools go out through buffers.cpp. The
// Python package (python/gfd/__init__.py) wraps these in the public classes; it resolves streams (torch's current stream) and keeps the
// Python objects of a transfer alive until it is done.
//
// Threading: every call that may block or take long (engine creation and shutdown, planning and
// gathering, waiting, pinning a pool) runs with the GIL released. Python objects are only touched
// with the GIL held.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "buffers.hpp"
#include "device/device.hpp"
#include "device/emulated_device.hpp"
#include "dlpack.hpp"
#include "engine_core.hpp"
#include "engine_holder.hpp"
#include "ext.hpp"
#include "gfd/gfd.hpp"
#include "host/host_pool.hpp"

namespace gfd::python {
namespace {

class PyEngine {
 public:
  // device: nullopt = GFD_DEVICE / 0.
  PyEngine(std::optional<int> device, const py::dict& kwargs, bool from_env) {
    EngineOptions o = from_env ? EngineOptions::from_env() : EngineOptions{};
    if (device) o.device = *device;
    o = options_from(o, kwargs);
    auto h = std::make_shared<EngineHolder>();
    h->ordinal = o.device;
    {
      py::gil_scoped_release nogil;
      KeepCurrentDevice keep;
      h->engine.emplace(o);
    }
    holder_ = std::move(h);
  }

  // An engine on the emulated device (testing).
  PyEngine(const py::dict& kwargs, std::uint32_t copy_delay_us, int ordinal, const std::string& fault) {
    EngineOptions o = options_from(EngineOptions{}, kwargs);
    o.device = ordinal;
    auto h = std::make_shared<EngineHolder>();
    detail::EmulatedDeviceOptions emu;
    emu.copy_delay = std::chrono::microseconds(copy_delay_us);
    if (!fault.empty()) emu.fault = [fault](const char* op) { return fault == op; };
    h->device = std::make_shared<detail::EmulatedDevice>(ordinal, emu);
    h->emulated = true;
    h->ordinal = ordinal;
    {
      py::gil_scoped_release nogil;
      h->default_stream = h->device->create_stream();
      h->engine.emplace(detail::EngineCore::make_engine(o, h->device));
    }
    holder_ = std::move(h);
  }

  std::shared_ptr<EngineHolder> holder() const {
    if (!holder_) throw Error(ErrorCode::kShutdown, "Engine: the engine is closed");
    return holder_;
  }

  void close() {
    sets_.clear();  // with the GIL: they hold Python objects
    std::shared_ptr<EngineHolder> h = std::move(holder_);
    py::gil_scoped_release nogil;
    h.reset();  // waits for the engine's transfers (unless a call in flight still holds it)
  }
  bool closed() const { return !holder_; }
  bool emulated() const { return holder()->emulated; }
  int device() const { return holder()->ordinal; }

  py::dict options() const { return options_dict(holder()->engine->options()); }
  py::dict stats() const {
    EngineStats s;
    {
      auto h = holder();
      py::gil_scoped_release nogil;
      s = h->engine->stats();
    }
    return stats_dict(s);
  }

  detail::StreamHandle stream_of(const EngineHolder& h, std::optional<std::uintptr_t> stream) const {
    if (stream) return reinterpret_cast<detail::StreamHandle>(*stream);
    return h.default_stream;  // nullptr (CUDA's default stream) except on the emulated device
  }

  // The device behind the engine, for the testing helpers and stream syncs.
  detail::Device& device_of(EngineHolder& h) { return h.device_of(); }

  // copy_to_device / copy_to_host with three integer arrays.
  std::unique_ptr<PyTransfer> copy(Direction dir, py::handle src, py::handle dst, py::handle sizes,
                                   std::optional<std::uintptr_t> stream) {
    const char* fn = dir == Direction::kToDevice ? "copy_to_device" : "copy_to_host";
    auto h = holder();
    IntArray s = int_array(src, std::string(fn) + ": src_ptrs", false);
    IntArray d = int_array(dst, std::string(fn) + ": dst_ptrs", false);
    IntArray n = int_array(sizes, std::string(fn) + ": sizes", true);
    for (auto* a : {&s, &d, &n})
      if (a->ndim != 1 && !a->scalar)
        bad_argument(std::string(fn) + ": src_ptrs, dst_ptrs and sizes must be 1-D");
    if (s.rows() != d.rows())
      bad_argument(std::string(fn) + ": src_ptrs has " + std::to_string(s.rows()) + " entries, dst_ptrs " +
                   std::to_string(d.rows()));
    if (!n.scalar && n.rows() != s.rows())
      bad_argument(std::string(fn) + ": sizes has " + std::to_string(n.rows()) + " entries, src_ptrs " +
                   std::to_string(s.rows()));
    const std::size_t count = s.rows();
    const detail::StreamHandle st = stream_of(*h, stream);
    Transfer t;
    {
      py::gil_scoped_release nogil;
      std::vector<BlockCopy> blocks(count);
      for (std::size_t i = 0; i < count; ++i) {
        std::uint64_t a = 0, b = 0, c = 0;
        if (!s.get(i, 0, a) || !d.get(i, 0, b) || !n.get(n.scalar ? 0 : i, 0, c))
          throw Error(ErrorCode::kInvalidArgument,
                      std::string(fn) + ": entry " + std::to_string(i) + " has a negative value", i);
        blocks[i] = {reinterpret_cast<const void*>(a), reinterpret_cast<void*>(b), static_cast<std::size_t>(c)};
      }
      auto cs = static_cast<cudaStream_t>(st);
      t = dir == Direction::kToDevice ? h->engine->copy_to_device(blocks, cs) : h->engine->copy_to_host(blocks, cs);
    }
    auto out = std::make_unique<PyTransfer>(std::move(t), nullptr);
    for (auto* a : {&s, &d, &n})
      if (a->owner) out->keep.append(a->owner);
    return out;
  }

  // vLLM's swap_blocks over P pairs of caches (one pair: one layer's K or V) and one mapping:
  // rows (src block, dst block) of `mapping` ([N, 2]), or src_ids / dst_ids ([N] each). One
  // transfer moves block src_id of every src cache to block dst_id of its dst cache. The lists
  // are described to the engine once (a CacheSet, found again by their tensors next time), so a
  // call costs the ids' check and the engine's submission, nothing per tensor.
  std::unique_ptr<PyTransfer> swap(const py::sequence& srcs, const py::sequence& dsts, py::handle mapping,
                                   py::handle src_ids, py::handle dst_ids, std::optional<std::uintptr_t> stream,
                                   const std::string& fn, const Names& src_names, const Names& dst_names) {
    auto h = holder();
    std::shared_ptr<PyCacheSet> set = sets_.find(srcs, dsts, fn);
    if (!set) {
      set = register_tensors(*h, srcs, dsts, fn, src_names, dst_names, false, stream_of(*h, stream));
      sets_.add(srcs, dsts, fn, set);
    }
    return copy_on_set(*h, *set, set->first_is_host, mapping, src_ids, dst_ids, stream_of(*h, stream), fn);
  }

  // Engine.register_caches(host, device): a set the caller keeps (it keeps its tensors alive).
  std::shared_ptr<PyCacheSet> register_caches(const py::sequence& host, const py::sequence& device,
                                              const Names& host_names, const Names& device_names) {
    auto h = holder();
    auto set = register_tensors(*h, host, device, "register_caches", host_names, device_names, true, std::nullopt);
    for (py::handle t : host) set->keep.append(t);
    for (py::handle t : device) set->keep.append(t);
    return set;
  }

  std::unique_ptr<PyTransfer> copy_blocks(const PyCacheSet& set, bool to_device, py::handle mapping,
                                          py::handle src_ids, py::handle dst_ids,
                                          std::optional<std::uintptr_t> stream) {
    auto h = holder();
    return copy_on_set(*h, set, to_device, mapping, src_ids, dst_ids, stream_of(*h, stream), "copy_blocks");
  }

 private:
  std::shared_ptr<EngineHolder> holder_;
  SetCache sets_;  // swap_blocks' sets (under the GIL)

 public:
  std::size_t cached_sets() const { return sets_.size(); }
};

// ---------------------------------------------------------------------------------------------

}  // namespace
}  // namespace gfd::python

using namespace gfd;
using namespace gfd::python;

PYBIND11_MODULE(_gfd, m) {
  m.doc() = "gfd's compiled core; use the gfd package.";

  register_error_type(m);
  m.attr("option_names") = py::cast(option_names());
  m.attr("stats_names") = py::cast(stats_names());
  m.attr("default_options") = options_dict(EngineOptions{});
  m.attr("dtype_names") = py::cast(dtype_names());
  m.def("backend_names", [] {
    std::vector<std::string> v;
    for (Backend b : kAllBackends) v.emplace_back(to_string(b));
    return v;
  });
  m.def("cuda_device_count", [] { return detail::cuda_device_count(); },
        "Usable CUDA devices (0 without a driver or GPU).");

  py::class_<PyTransfer>(m, "_Transfer")
      .def("done", &PyTransfer::done)
      .def("wait", &PyTransfer::wait, py::arg("timeout") = py::none())
      .def("error", &PyTransfer::error)
      .def_property_readonly("bytes", &PyTransfer::bytes)
      .def_readwrite("keep", &PyTransfer::keep);

  py::class_<PyEngine>(m, "_Engine")
      .def(py::init<std::optional<int>, const py::dict&, bool>(), py::arg("device"), py::arg("options"),
           py::arg("from_env"))
      .def("close", &PyEngine::close)
      .def_property_readonly("closed", &PyEngine::closed)
      .def_property_readonly("emulated", &PyEngine::emulated)
      .def_property_readonly("device", &PyEngine::device)
      .def("options", &PyEngine::options)
      .def("stats", &PyEngine::stats)
      .def("copy_to_device",
           [](PyEngine& e, py::handle s, py::handle d, py::handle n, std::optional<std::uintptr_t> st) {
             return e.copy(Direction::kToDevice, s, d, n, st);
           })
      .def("copy_to_host",
           [](PyEngine& e, py::handle s, py::handle d, py::handle n, std::optional<std::uintptr_t> st) {
             return e.copy(Direction::kToHost, s, d, n, st);
           })
      .def("swap", [](PyEngine& e, const py::sequence& srcs, const py::sequence& dsts, py::handle mapping,
                      py::handle src_ids, py::handle dst_ids, std::optional<std::uintptr_t> st, const std::string& fn,
                      const Names& src_names, const Names& dst_names) {
        return e.swap(srcs, dsts, mapping, src_ids, dst_ids, st, fn, src_names, dst_names);
      })
      .def("register_caches", &PyEngine::register_caches)
      .def_property_readonly("_cached_sets", &PyEngine::cached_sets)
      .def("copy_blocks", &PyEngine::copy_blocks);

  py::class_<PyCacheSet, std::shared_ptr<PyCacheSet>>(m, "_CacheSet")
      .def_property_readonly("pairs", [](const PyCacheSet& s) { return s.pairs; })
      .def_property_readonly("host_pinned", [](const PyCacheSet& s) { return s.set.host_pinned(); })
      .def_property_readonly("bytes_per_id", [](const PyCacheSet& s) { return s.set.bytes_per_id(); })
      .def_property_readonly("host_blocks", [](const PyCacheSet& s) { return s.set.host_blocks(); })
      .def_property_readonly("device_blocks", [](const PyCacheSet& s) { return s.set.device_blocks(); })
      .def_property_readonly("device", [](const PyCacheSet& s) { return s.set.device(); });

  register_buffers(m);

  // Testing hooks (gfd._testing): the emulated device, whose "device memory" is host memory, so
  // that the whole binding runs without a GPU; and device-memory helpers for any engine.
  py::module_ t = m.def_submodule("_testing", "Testing hooks: see gfd._testing.");
  t.def("emulated_engine", [](const py::dict& options, std::uint32_t copy_delay_us, int ordinal,
                              const std::string& fault) {
    return std::make_unique<PyEngine>(options, copy_delay_us, ordinal, fault);
  }, py::arg("options"), py::arg("copy_delay_us") = 0, py::arg("ordinal") = 0, py::arg("fault") = "");
  t.def("device_buffer", [](PyEngine& e, py::handle shape, const std::string& dtype) {
    auto h = e.holder();
    detail::Device& d = e.device_of(*h);
    Buffer b;
    b.shape = shape_from(shape);
    b.dtype = &dtype_named(dtype);
    void* p = nullptr;
    {
      KeepCurrentDevice keep;
      p = d.alloc_device(std::max<std::size_t>(b.nbytes(), 1));
    }
    std::shared_ptr<detail::Device> dev = h->device;
    b.owner = std::shared_ptr<void>(p, [dev](void* q) { dev->free_device(q); });
    b.data = static_cast<std::byte*>(p);
    b.device_type = dlpack::kCUDA;
    b.device_id = h->ordinal;
    b.host_accessible = h->emulated;  // emulated device memory is host memory
    return b;
  }, py::arg("engine"), py::arg("shape"), py::arg("dtype"));
  t.def("pinned_buffer", [](PyEngine& e, py::handle shape, const std::string& dtype) {
    auto h = e.holder();
    Buffer probe;
    probe.shape = shape_from(shape);
    probe.dtype = &dtype_named(dtype);
    auto pool = make_pool(std::max<std::size_t>(probe.nbytes(), 1), h->ordinal, -2, true,
                          h->emulated ? h->device : nullptr);
    return pool_view(pool, shape, dtype, 0);
  }, py::arg("engine"), py::arg("shape"), py::arg("dtype"));
  t.def("create_stream", [](PyEngine& e) {
    auto h = e.holder();
    KeepCurrentDevice keep;
    return reinterpret_cast<std::uintptr_t>(e.device_of(*h).create_stream());
  });
  t.def("destroy_stream", [](PyEngine& e, std::uintptr_t s) {
    auto h = e.holder();
    py::gil_scoped_release nogil;
    e.device_of(*h).destroy_stream(reinterpret_cast<detail::StreamHandle>(s));
  });
  t.def("stream_sync", [](PyEngine& e, std::optional<std::uintptr_t> s) {
    auto h = e.holder();
    detail::StreamHandle st = e.stream_of(*h, s);
    py::gil_scoped_release nogil;
    e.device_of(*h).stream_sync(st);
  }, py::arg("engine"), py::arg("stream") = py::none());
  t.def("delay", [](PyEngine& e, std::uint32_t us, std::optional<std::uintptr_t> s) {
    auto h = e.holder();
    e.device_of(*h).delay_async(us, e.stream_of(*h, s));
  }, py::arg("engine"), py::arg("microseconds"), py::arg("stream") = py::none());
  t.def("copy", [](PyEngine& e, std::uintptr_t dst, std::uintptr_t src, std::size_t bytes, bool to_device,
                   std::optional<std::uintptr_t> s) {
    auto h = e.holder();
    detail::Device& d = e.device_of(*h);
    auto st = e.stream_of(*h, s);
    py::gil_scoped_release nogil;
    if (to_device) d.copy_h2d(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes, st);
    else d.copy_d2h(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes, st);
  }, py::arg("engine"), py::arg("dst"), py::arg("src"), py::arg("bytes"), py::arg("to_device"),
     py::arg("stream") = py::none(),
     "One plain asynchronous copy on `stream` (the contiguous reference of the benchmark).");
  t.def("memcpy_batch", [](PyEngine& e, std::uintptr_t dsts, std::uintptr_t srcs, std::uintptr_t sizes,
                           std::size_t count, bool to_device, std::uintptr_t stream) {
    // vLLM's CPU offloading copy path (swap_blocks_batch): one cudaMemcpyBatchAsync of every
    // descriptor, sources read in any order for loads and in stream order for stores. The
    // arrays are `count` pointers / sizes at those addresses (numpy's .ctypes.data).
    auto h = e.holder();
    if (h->emulated) bad_argument("memcpy_batch: needs a CUDA device, not the emulated one");
    if (count == 0) return;
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = to_device ? cudaMemcpySrcAccessOrderAny : cudaMemcpySrcAccessOrderStream;
    attr.srcLocHint.type = to_device ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
    attr.srcLocHint.id = to_device ? 0 : h->ordinal;
    attr.dstLocHint.type = to_device ? cudaMemLocationTypeDevice : cudaMemLocationTypeHost;
    attr.dstLocHint.id = to_device ? h->ordinal : 0;
    std::size_t attr_index = 0;
    auto check_cuda = [](cudaError_t err, const char* what) {
      if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
    };
    py::gil_scoped_release nogil;
    KeepCurrentDevice keep;
    check_cuda(cudaSetDevice(h->ordinal), "memcpy_batch: cudaSetDevice");
    check_cuda(cudaMemcpyBatchAsync(reinterpret_cast<void**>(dsts), reinterpret_cast<const void**>(srcs),
                                    reinterpret_cast<const std::size_t*>(sizes), count, &attr, &attr_index, 1,
                                    reinterpret_cast<cudaStream_t>(stream)),
               "memcpy_batch: cudaMemcpyBatchAsync");
  }, py::arg("engine"), py::arg("dsts"), py::arg("srcs"), py::arg("sizes"), py::arg("count"), py::arg("to_device"),
     py::arg("stream"));
  // The engine's trace (src/probe.hpp): start, then take the points as tuples
  // (ns, transfer, what, thread, a, b) with `what` a TraceEvent::What (see trace_event.hpp).
  t.def("trace_start", [](PyEngine& e, std::size_t capacity) {
    auto h = e.holder();
    detail::EngineCore::of(*h->engine).start_trace(capacity);
  }, py::arg("engine"), py::arg("capacity") = std::size_t{1} << 20);
  t.def("trace_take", [](PyEngine& e) {
    auto h = e.holder();
    std::vector<detail::TraceEvent> ev;
    {
      py::gil_scoped_release nogil;
      ev = detail::EngineCore::of(*h->engine).take_trace();
    }
    py::list out;
    for (const auto& x : ev) out.append(py::make_tuple(x.ns, x.transfer, x.what, x.thread, x.a, x.b));
    return out;
  }, py::arg("engine"));
  t.def("memset", [](PyEngine& e, std::uintptr_t dst, int value, std::size_t bytes, std::optional<std::uintptr_t> s) {
    auto h = e.holder();
    e.device_of(*h).memset_async(reinterpret_cast<void*>(dst), value, bytes, e.stream_of(*h, s));
  }, py::arg("engine"), py::arg("dst"), py::arg("value"), py::arg("bytes"), py::arg("stream") = py::none());
  t.def("pointer_kind", [](PyEngine& e, std::uintptr_t p) {
    auto h = e.holder();
    switch (e.device_of(*h).query_pointer(reinterpret_cast<const void*>(p)).kind) {
      case detail::PointerKind::kPageableHost: return "pageable";
      case detail::PointerKind::kPinnedHost: return "pinned";
      case detail::PointerKind::kDevice: return "device";
      case detail::PointerKind::kOtherDevice: return "other_device";
      case detail::PointerKind::kManaged: return "managed";
    }
    return "unknown";
  });
}
