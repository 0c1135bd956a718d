// gfd.testing's compiled hooks (gfd._gfd.testing): test a runtime integration without a GPU. An
// engine on the emulated device (its "device memory" is host memory, its streams threads that
// keep CUDA's ordering), device buffers, pinned buffers and streams of an engine's device, and
// the engine's trace, all through the test-device facade (testkit/testkit.hpp).
#include <cuda_runtime_api.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "buffer.hpp"
#include "engine.hpp"
#include "ext.hpp"
#include "testkit/testkit.hpp"

namespace gfd::python {
namespace {

// The device behind an engine (a testkit::Device): the emulated one, or a CUDA device opened
// at first use. A copy: it shares the device.
testkit::Device device_of(PyEngine& e) {
  (void)e.engine();  // closed: gfd.Error
  if (!e.testing_device()) {
    KeepCurrentDevice keep;
    e.testing_device() = std::make_shared<testkit::Device>(testkit::Device::cuda(e.device()));
  }
  return *std::static_pointer_cast<testkit::Device>(e.testing_device());
}

cudaStream_t stream_arg(PyEngine& e, py::handle s, const std::string& fn) {
  return e.stream_of(s, fn);
}

std::uint64_t address(py::handle v, const std::string& name) {
  return uint_arg(v, name, UINTPTR_MAX);
}

}  // namespace

void register_testing(py::module_& m) {
  py::module_ t = m.def_submodule("testing", "gfd.testing's compiled hooks: see gfd.testing.");
  t.def(
      "emulated_engine",
      [](const py::dict& options, py::handle copy_delay_us, py::handle ordinal,
         const std::string& fault) {
        EngineOptions o = options_from(EngineOptions{}, options);
        const auto delay = static_cast<std::uint32_t>(
            uint_arg(copy_delay_us, "emulated_engine: copy_delay_us", UINT32_MAX));
        o.device = static_cast<int>(int_arg(ordinal, "emulated_engine: ordinal", 0, 1 << 20));
        testkit::EmulatedOptions emu;
        emu.copy_delay = std::chrono::microseconds(delay);
        if (!fault.empty()) emu.fault = [fault](const char* op) { return fault == op; };
        auto device = std::make_shared<testkit::Device>(testkit::Device::emulated(o.device, emu));
        std::shared_ptr<Engine> engine;
        cudaStream_t s = nullptr;
        {
          py::gil_scoped_release nogil;
          s = device->create_stream();
          // The stream standing in for the default stream goes once the engine is gone.
          engine =
              std::shared_ptr<Engine>(new Engine(device->make_engine(o)), [device, s](Engine* x) {
                delete x;
                device->destroy_stream(s);
              });
        }
        return std::make_unique<PyEngine>(std::move(engine), o.device, true, s, device);
      },
      py::arg("options"), py::arg("copy_delay_us") = 0, py::arg("ordinal") = 0,
      py::arg("fault") = "");
  t.def(
      "device_buffer",
      [](PyEngine& e, py::handle shape, py::handle dtype) {
        testkit::Device d = device_of(e);
        Buffer b;
        b.shape = shape_from(shape, "device_buffer: shape");
        b.dtype = &dtype_arg(dtype, "device_buffer: dtype");
        b.nbytes = shape_bytes(b.shape, b.itemsize(), "device_buffer: shape");
        void* p = nullptr;
        {
          KeepCurrentDevice keep;
          p = d.alloc_device(std::max<std::size_t>(b.nbytes, 1));
        }
        b.owner = std::shared_ptr<void>(p, [d](void* q) mutable { d.free_device(q); });
        b.data = static_cast<std::byte*>(p);
        b.device_type = dlpack::kCUDA;
        b.device_id = e.device();
        b.host_accessible = e.emulated();  // emulated device memory is host memory
        return b;
      },
      py::arg("engine"), py::arg("shape"), py::arg("dtype") = "uint8");
  t.def(
      "pinned_buffer",
      [](PyEngine& e, py::handle shape, py::handle dtype) {
        (void)e.engine();  // closed: gfd.Error
        const DType& type = dtype_arg(dtype, "pinned_buffer: dtype");
        const std::vector<std::int64_t> dims = shape_from(shape, "pinned_buffer: shape");
        const std::size_t bytes =
            shape_bytes(dims, item_bytes(type.dl, "dtype"), "pinned_buffer: shape");
        HostPoolOptions o{.bytes = std::max<std::size_t>(bytes, 1),
                          .device = e.device(),
                          .numa_node = -2,
                          .register_memory = true};
        std::shared_ptr<HostPool> pool;
        {
          std::optional<testkit::Device> dev;
          if (e.emulated()) dev = device_of(e);
          py::gil_scoped_release nogil;
          pool = dev ? std::make_shared<HostPool>(testkit::make_host_pool(*dev, o))
                     : std::make_shared<HostPool>(o);
        }
        return pool_view(pool, shape, type, py::int_(0), "pinned_buffer");
      },
      py::arg("engine"), py::arg("shape"), py::arg("dtype") = "uint8");
  t.def("adopt_device_memory", [](PyEngine& e, py::handle ptr, py::handle bytes) {
    if (!e.emulated())
      bad_argument("adopt_device_memory: the engine is not on the emulated device");
    const std::uint64_t p = address(ptr, "adopt_device_memory: ptr");
    const std::uint64_t n = uint_arg(bytes, "adopt_device_memory: nbytes", UINTPTR_MAX);
    testkit::Device dev = device_of(e);
    dev.adopt_device_memory(reinterpret_cast<void*>(p), n);
    // The release holds the device, not the engine: it works after the engine has closed.
    return py::cpp_function([dev, p]() mutable {
      py::gil_scoped_release nogil;  // waits for the copies queued on the memory
      dev.release_device_memory(reinterpret_cast<void*>(p));
    });
  });
  t.def("create_stream", [](PyEngine& e) {
    KeepCurrentDevice keep;
    return reinterpret_cast<std::uintptr_t>(device_of(e).create_stream());
  });
  t.def("destroy_stream", [](PyEngine& e, py::handle s) {
    testkit::Device d = device_of(e);
    auto st = reinterpret_cast<cudaStream_t>(address(s, "destroy_stream: stream"));
    py::gil_scoped_release nogil;
    d.destroy_stream(st);
  });
  t.def(
      "stream_sync",
      [](PyEngine& e, py::handle s) {
        testkit::Device d = device_of(e);
        cudaStream_t st = stream_arg(e, s, "stream_sync");
        py::gil_scoped_release nogil;
        d.stream_sync(st);
      },
      py::arg("engine"), py::arg("stream") = py::none());
  t.def(
      "delay",
      [](PyEngine& e, py::handle us, py::handle s) {
        testkit::Device d = device_of(e);
        const auto n = static_cast<std::uint32_t>(uint_arg(us, "delay: microseconds", UINT32_MAX));
        d.delay_async(n, stream_arg(e, s, "delay"));
      },
      py::arg("engine"), py::arg("microseconds"), py::arg("stream") = py::none());
  t.def(
      "copy",
      [](PyEngine& e, py::handle dst, py::handle src, py::handle bytes, bool to_device,
         py::handle s) {
        testkit::Device d = device_of(e);
        const std::uint64_t dp = address(dst, "copy: dst"), sp = address(src, "copy: src");
        const std::uint64_t n = uint_arg(bytes, "copy: nbytes", host_address_end());
        check_host_range(to_device ? sp : dp, n, to_device ? "copy: src" : "copy: dst", kNoBlock);
        auto st = stream_arg(e, s, "copy");
        py::gil_scoped_release nogil;
        if (to_device)
          d.copy_h2d(reinterpret_cast<void*>(dp), reinterpret_cast<const void*>(sp), n, st);
        else
          d.copy_d2h(reinterpret_cast<void*>(dp), reinterpret_cast<const void*>(sp), n, st);
      },
      py::arg("engine"), py::arg("dst"), py::arg("src"), py::arg("bytes"), py::arg("to_device"),
      py::arg("stream") = py::none(),
      "One plain asynchronous copy on `stream` (the contiguous reference of the benchmark).");
  t.def(
      "memcpy_batch",
      [](PyEngine& e, py::handle dsts_arg, py::handle srcs_arg, py::handle sizes_arg,
         py::handle count_arg, bool to_device, py::handle stream_arg_) {
        // vLLM's CPU offloading copy path (swap_blocks_batch): one cudaMemcpyBatchAsync of every
        // descriptor, sources read in any order for loads and in stream order for stores. The
        // arrays are `count` pointers / sizes at those addresses (numpy's .ctypes.data).
        (void)e.engine();  // closed: gfd.Error
        if (e.emulated()) bad_argument("memcpy_batch: needs a CUDA device, not the emulated one");
        const std::uint64_t dsts = address(dsts_arg, "memcpy_batch: dsts"),
                            srcs = address(srcs_arg, "memcpy_batch: srcs");
        const std::uint64_t sizes = address(sizes_arg, "memcpy_batch: sizes");
        const std::uint64_t count =
            uint_arg(count_arg, "memcpy_batch: count", host_address_end() / 8);
        const auto stream = e.stream_of(stream_arg_, "memcpy_batch");
        if (count == 0) return;
        for (const auto& [p, name] :
             {std::pair{dsts, "memcpy_batch: dsts"}, std::pair{srcs, "memcpy_batch: srcs"},
              std::pair{sizes, "memcpy_batch: sizes"}})
          check_host_range(p, count * 8, name, kNoBlock);
        cudaMemcpyAttributes attr{};
        attr.srcAccessOrder =
            to_device ? cudaMemcpySrcAccessOrderAny : cudaMemcpySrcAccessOrderStream;
        attr.srcLocHint.type = to_device ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
        attr.srcLocHint.id = to_device ? 0 : e.device();
        attr.dstLocHint.type = to_device ? cudaMemLocationTypeDevice : cudaMemLocationTypeHost;
        attr.dstLocHint.id = to_device ? e.device() : 0;
        std::size_t attr_index = 0;
        auto check_cuda = [](cudaError_t err, const char* what) {
          if (err != cudaSuccess)
            throw Error(ErrorCode::kCuda, std::string(what) + ": " + cudaGetErrorString(err));
        };
        py::gil_scoped_release nogil;
        KeepCurrentDevice keep;
        check_cuda(cudaSetDevice(e.device()), "memcpy_batch: cudaSetDevice");
        check_cuda(cudaMemcpyBatchAsync(reinterpret_cast<void**>(dsts),
                                        reinterpret_cast<const void**>(srcs),
                                        reinterpret_cast<const std::size_t*>(sizes), count, &attr,
                                        &attr_index, 1, stream),
                   "memcpy_batch: cudaMemcpyBatchAsync");
      },
      py::arg("engine"), py::arg("dsts"), py::arg("srcs"), py::arg("sizes"), py::arg("count"),
      py::arg("to_device"), py::arg("stream"));
  t.def(
      "uva_copy",
      [](PyEngine& e, py::handle dsts_arg, py::handle srcs_arg, py::handle sizes_arg,
         py::handle count_arg, py::handle ctas_arg, py::handle stream_arg_) {
        // The SM peer of the copy engines (testkit::uva_copy, the kernel gfd_benchmark measures):
        // `count` pointers / sizes at those addresses, which the kernel itself reads as it runs,
        // so they must be memory the GPU reads (device, or pinned host memory), unlike
        // memcpy_batch's, which the call reads.
        // The arguments are checked first, on any device, then the device.
        (void)e.engine();  // closed: gfd.Error
        const std::uint64_t dsts = address(dsts_arg, "uva_copy: dsts"),
                            srcs = address(srcs_arg, "uva_copy: srcs");
        const std::uint64_t sizes = address(sizes_arg, "uva_copy: sizes");
        const std::uint64_t count = uint_arg(count_arg, "uva_copy: count", host_address_end() / 8);
        const int ctas =
            static_cast<int>(int_arg(ctas_arg, "uva_copy: ctas", 1, testkit::kMaxUvaCtas));
        const auto stream = e.stream_of(stream_arg_, "uva_copy");
        const std::pair<std::uint64_t, const char*> arrays[] = {
            {dsts, "uva_copy: dsts"}, {srcs, "uva_copy: srcs"}, {sizes, "uva_copy: sizes"}};
        for (const auto& [p, name] : arrays)
          if (p == 0 && count != 0)
            bad_argument(std::string(name) + ": null, with " + std::to_string(count) + " copies");
        if (e.emulated())
          bad_argument("uva_copy: an SM copy kernel needs a CUDA device, not the emulated one");
        if (count == 0) return;
        testkit::Device d = device_of(e);
        KeepCurrentDevice keep;
        for (const auto& [p, name] : arrays) {
          for (const std::uint64_t at : {p, p + count * 8 - 1}) {
            const std::string kind = d.pointer_kind(reinterpret_cast<const void*>(at));
            if (kind != "device" && kind != "pinned")
              bad_argument(std::string(name) + ": " + kind +
                           " memory; the kernel reads the array as it runs, so it must be device "
                           "memory or pinned host memory of the engine's GPU");
          }
        }
        py::gil_scoped_release nogil;
        testkit::uva_copy(d, reinterpret_cast<void* const*>(dsts),
                          reinterpret_cast<const void* const*>(srcs),
                          reinterpret_cast<const std::uint64_t*>(sizes), count, ctas, stream);
      },
      py::arg("engine"), py::arg("dsts"), py::arg("srcs"), py::arg("sizes"), py::arg("count"),
      py::arg("ctas"), py::arg("stream"));
  // The engine's trace: start, then take the points as tuples (ns, transfer, what, thread, a, b)
  // with `what` a TraceEvent::What (src/trace_event.hpp).
  t.def(
      "trace_start",
      [](PyEngine& e, py::handle capacity) {
        const auto n = static_cast<std::size_t>(
            uint_arg(capacity, "trace_start: capacity", std::size_t{1} << 30));
        std::shared_ptr<Engine> engine = e.engine();
        testkit::start_trace(*engine, n);
      },
      py::arg("engine"), py::arg("capacity") = std::size_t{1} << 20);
  t.def(
      "trace_take",
      [](PyEngine& e) {
        std::shared_ptr<Engine> engine = e.engine();
        std::vector<testkit::TraceEvent> ev;
        {
          py::gil_scoped_release nogil;
          ev = testkit::take_trace(*engine);
        }
        py::list out;
        for (const auto& x : ev)
          out.append(py::make_tuple(x.ns, x.transfer, x.what, x.thread, x.a, x.b));
        return out;
      },
      py::arg("engine"));
  t.def(
      "memset",
      [](PyEngine& e, py::handle dst, py::handle value, py::handle bytes, py::handle s) {
        testkit::Device d = device_of(e);
        const std::uint64_t dp = address(dst, "memset: dst");
        const int v = static_cast<int>(int_arg(value, "memset: value", 0, 255));
        const std::uint64_t n = uint_arg(bytes, "memset: nbytes", host_address_end());
        d.memset_async(reinterpret_cast<void*>(dp), v, n, stream_arg(e, s, "memset"));
      },
      py::arg("engine"), py::arg("dst"), py::arg("value"), py::arg("bytes"),
      py::arg("stream") = py::none());
  t.def("pointer_kind", [](PyEngine& e, py::handle p) {
    const std::uint64_t a = address(p, "pointer_kind: address");
    return device_of(e).pointer_kind(reinterpret_cast<const void*>(a));
  });
}

}  // namespace gfd::python
