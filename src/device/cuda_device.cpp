// The CUDA implementation of the device interface.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <filesystem>
#include <string>
#include <vector>

#include "device/cuda_check.hpp"
#include "device/cuda_driver.hpp"
#include "device/device.hpp"
#include "device/kernels.cuh"

namespace gfd::detail {
namespace {

// Errors of the first runtime call that mean "there is no GPU to use here" rather than a fault:
// no driver (the runtime reports an insufficient driver when libcuda is absent), a driver older
// than the runtime, no device, or every device unavailable.
bool means_no_device(cudaError_t err) {
  switch (err) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemNotReady:
    case cudaErrorCallRequiresNewerDriver:
      return true;
    default:
      return false;
  }
}

// What a user without a GPU can do instead: the emulated device runs gfd's whole pipeline on the
// CPU, reachable from Python (a C++ program needs a GPU).
constexpr const char* kWithoutAGpu =
    "without a GPU, gfd runs on its emulated device: gfd.testing.emulated_engine() in Python, "
    "GFD_EMULATED_DEVICE=1 for gfd.vllm and gfd.sglang";

// Checks that CUDA device `ordinal` exists, with plain messages for the cases a user meets on a
// machine without a GPU (ErrorCode::kNoDevice) instead of a CUDA error code.
void check_device_exists(int ordinal) {
  if (ordinal < 0)
    throw Error(ErrorCode::kInvalidArgument,
                "device: " + std::to_string(ordinal) + " is not a CUDA device ordinal (negative)");
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    if (means_no_device(err)) {
      // Without libcuda the runtime says "driver version is insufficient": say what it means.
      const bool driver_loaded = std::filesystem::exists("/proc/driver/nvidia/version");
      const std::string what =
          !driver_loaded ? "no NVIDIA driver or GPU was found on this machine"
          : err == cudaErrorInsufficientDriver
              ? "the NVIDIA driver is older than the CUDA runtime gfd was built with"
              : "no usable NVIDIA GPU was found";
      throw Error(ErrorCode::kNoDevice, what + " (" + cudaGetErrorName(err) + ": " +
                                            cudaGetErrorString(err) + "); " + kWithoutAGpu);
    }
    GFD_CUDA_CHECK(err);
  }
  if (count == 0)
    throw Error(ErrorCode::kNoDevice,
                std::string("no NVIDIA GPU was found (the driver reports none); ") + kWithoutAGpu);
  if (ordinal >= count)
    throw Error(ErrorCode::kNoDevice, "CUDA device " + std::to_string(ordinal) +
                                          " does not exist (" + std::to_string(count) +
                                          " visible)");
}

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {
    check_device_exists(ordinal);
    GFD_CUDA_CHECK(cudaSetDevice(ordinal));
    char bus[32] = {};
    GFD_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, ordinal));
    bus_id_ = bus;
    std::transform(bus_id_.begin(), bus_id_.end(), bus_id_.begin(), ::tolower);
    GFD_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&prio_low_, &prio_high_));
    int host_ptr = 0, uva = 0;
    GFD_CUDA_CHECK(
        cudaDeviceGetAttribute(&host_ptr, cudaDevAttrCanUseHostPointerForRegisteredMem, ordinal));
    GFD_CUDA_CHECK(cudaDeviceGetAttribute(&uva, cudaDevAttrUnifiedAddressing, ordinal));
    host_pointers_usable_ = host_ptr != 0 && uva != 0;
    GFD_CUDA_CHECK(preload_kernels());
    int memops = 0;
    if (driver().device_get_attribute(&memops, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
                                      static_cast<CUdevice>(ordinal)) == CUDA_SUCCESS)
      wait_value_ = memops != 0 && host_pointers_usable_;
  }

  int ordinal() const override { return ordinal_; }
  std::string pci_bus_id() const override { return bus_id_; }
  std::vector<std::string> all_bus_ids() const override {
    std::vector<std::string> ids;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) return ids;
    for (int i = 0; i < count; ++i) {
      char bus[32] = {};
      if (cudaDeviceGetPCIBusId(bus, sizeof bus, i) == cudaSuccess) ids.emplace_back(bus);
    }
    return ids;
  }
  void make_current() override { GFD_CUDA_CHECK(cudaSetDevice(ordinal_)); }
  int current() const override {
    int d = -1;
    return cudaGetDevice(&d) == cudaSuccess ? d : -1;
  }
  void restore_current(int previous) noexcept override {
    if (previous >= 0 && previous != ordinal_) (void)cudaSetDevice(previous);
  }

  // One driver call per pointer (it runs for every transfer, on the latency path): kind, device,
  // managed or not, and the allocation's range. Memory the driver does not know reads as all
  // zeros (cuPointerGetAttributes succeeds and leaves defaults).
  PointerInfo query_pointer(const void* p) override {
    PointerInfo info;
    CUpointer_attribute attrs[] = {
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        CU_POINTER_ATTRIBUTE_IS_MANAGED, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    // Every value in zeroed 8-byte storage: the driver writes 4 bytes for some, 8 for others.
    std::uint64_t v[5] = {0, 0, 0, 0, 0};
    void* data[5] = {&v[0], &v[1], &v[2], &v[3], &v[4]};
    if (driver().pointer_get_attributes(5, attrs, data, reinterpret_cast<CUdeviceptr>(p)) !=
        CUDA_SUCCESS)
      return info;
    const auto type = static_cast<std::uint32_t>(v[0]);
    const auto ordinal = static_cast<std::int32_t>(static_cast<std::uint32_t>(v[1]));
    const bool managed = static_cast<std::uint32_t>(v[2]) != 0;
    if (managed)
      info.kind = PointerKind::kManaged;
    else if (type == CU_MEMORYTYPE_HOST)
      info.kind = PointerKind::kPinnedHost;
    else if (type == CU_MEMORYTYPE_DEVICE)
      info.kind = ordinal == ordinal_ ? PointerKind::kDevice : PointerKind::kOtherDevice;
    else
      return info;  // unknown to the driver: pageable host memory
    info.device = ordinal;
    if (v[4] != 0) {
      info.begin = static_cast<std::uintptr_t>(v[3]);
      info.end = info.begin + static_cast<std::uintptr_t>(v[4]);
    }
    return info;
  }

  void* alloc_device(std::size_t bytes) override {
    make_current();
    void* p = nullptr;
    GFD_CUDA_CHECK(cudaMalloc(&p, bytes));
    return p;
  }
  void free_device(void* p) noexcept override { (void)cudaFree(p); }
  void register_host(void* p, std::size_t bytes) override {
    // Mapped: the zero-copy kernel reads registered memory at its host address.
    GFD_CUDA_CHECK(cudaHostRegister(p, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped));
  }
  void unregister_host(void* p) noexcept override { (void)cudaHostUnregister(p); }

  StreamHandle create_stream() override {
    make_current();
    cudaStream_t s = nullptr;
    GFD_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, prio_high_));
    return s;
  }
  void destroy_stream(StreamHandle s) noexcept override {
    (void)cudaStreamDestroy(static_cast<cudaStream_t>(s));
  }
  void stream_sync(StreamHandle s) override {
    GFD_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(s)));
  }
  EventHandle create_event(bool timing) override {
    make_current();
    cudaEvent_t e = nullptr;
    GFD_CUDA_CHECK(
        cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    return e;
  }
  void destroy_event(EventHandle e) noexcept override {
    (void)cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
  void record_event(EventHandle e, StreamHandle s) override {
    GFD_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(s)));
  }
  void stream_wait_event(StreamHandle s, EventHandle e) override {
    GFD_CUDA_CHECK(
        cudaStreamWaitEvent(static_cast<cudaStream_t>(s), static_cast<cudaEvent_t>(e), 0));
  }
  bool event_done(EventHandle e) override {
    const cudaError_t r = cudaEventQuery(static_cast<cudaEvent_t>(e));
    if (r == cudaErrorNotReady) return false;
    GFD_CUDA_CHECK(r);
    return true;
  }
  void event_sync(EventHandle e) override {
    GFD_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(e)));
  }
  float event_elapsed_ms(EventHandle a, EventHandle b) override {
    float ms = 0;
    GFD_CUDA_CHECK(
        cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(a), static_cast<cudaEvent_t>(b)));
    return ms;
  }
  void copy_h2d(void* dst, const void* src, std::size_t bytes, StreamHandle s) override {
    GFD_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(s)));
  }
  void copy_d2h(void* dst, const void* src, std::size_t bytes, StreamHandle s) override {
    GFD_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(s)));
  }
  void memset_async(void* dst, int value, std::size_t bytes, StreamHandle s) override {
    GFD_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(s)));
  }
  void scatter(const ScatterEntry* entries, std::uint32_t count, const void* staging,
               StreamHandle s) override {
    GFD_CUDA_CHECK(launch_scatter(entries, count, staging, static_cast<cudaStream_t>(s)));
  }
  void copy_2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
               std::size_t width, std::size_t rows, bool to_host, StreamHandle s) override {
    GFD_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows,
                                     to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
                                     static_cast<cudaStream_t>(s)));
  }
  void copy_2d_batch(const Copy2D* copies, std::size_t count, bool to_host,
                     StreamHandle s) override {
    if (count == 1 || !batch_3d_ || !batch_2d(copies, count, !to_host, to_host, s))
      Device::copy_2d_batch(copies, count, to_host, s);
  }
  void copy_2d_on_device(const Copy2D* copies, std::size_t count, StreamHandle s) override {
    if (count > 1 && batch_3d_ && batch_2d(copies, count, false, false, s)) return;
    for (std::size_t i = 0; i < count; ++i) {
      const Copy2D& c = copies[i];
      GFD_CUDA_CHECK(cudaMemcpy2DAsync(c.dst, c.dpitch, c.src, c.spitch, c.width, c.rows,
                                       cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(s)));
    }
  }
  void copy_batch(void* const* dsts, const void* const* srcs, const std::size_t* sizes,
                  std::size_t count, bool to_host, StreamHandle s) override {
    if (count == 0) return;
    if (default_stream(s)) {
      // The batch calls reject the default streams (cudaErrorInvalidValue): one copy at a time.
      for (std::size_t i = 0; i < count; ++i) {
        if (to_host)
          copy_d2h(dsts[i], srcs[i], sizes[i], s);
        else
          copy_h2d(dsts[i], srcs[i], sizes[i], s);
      }
      return;
    }
    // One attribute per copy (all alike): sources are read in stream order, as a KV pool that
    // earlier work on the stream may still write requires.
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.srcLocHint.type = to_host ? cudaMemLocationTypeDevice : cudaMemLocationTypeHost;
    attr.srcLocHint.id = to_host ? ordinal_ : 0;
    attr.dstLocHint.type = to_host ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
    attr.dstLocHint.id = to_host ? 0 : ordinal_;
    thread_local std::vector<cudaMemcpyAttributes> attrs;
    thread_local std::vector<std::size_t> idx;
    attrs.assign(count, attr);
    idx.resize(count);
    for (std::size_t i = 0; i < count; ++i) idx[i] = i;
    GFD_CUDA_CHECK(cudaMemcpyBatchAsync(dsts, srcs, sizes, count, attrs.data(), idx.data(), count,
                                        static_cast<cudaStream_t>(s)));
  }
  void place(PlaceChunk* chunks, std::uint32_t n, std::uint64_t bytes, std::uint32_t max_blocks,
             std::uint32_t* counter, StreamHandle s) override {
    GFD_CUDA_CHECK(
        launch_place(chunks, n, bytes, max_blocks, counter, static_cast<cudaStream_t>(s)));
  }
  void gather(const ScatterEntry* entries, std::uint32_t count, void* staging,
              StreamHandle s) override {
    GFD_CUDA_CHECK(launch_gather(entries, count, staging, static_cast<cudaStream_t>(s)));
  }
  void pack(PackChunk* chunks, std::uint32_t n, std::uint64_t bytes, std::uint32_t max_blocks,
            StreamHandle s) override {
    GFD_CUDA_CHECK(launch_pack(chunks, n, bytes, max_blocks, static_cast<cudaStream_t>(s)));
  }
  void zero_copy(const ZeroCopyEntry* entries, std::uint32_t count, StreamHandle s) override {
    GFD_CUDA_CHECK(launch_zero_copy(entries, count, static_cast<cudaStream_t>(s)));
  }
  bool host_pointers_usable() const override { return host_pointers_usable_; }
  bool supports_wait_value() const override { return wait_value_; }
  void wait_value_geq(const std::uint64_t* addr, std::uint64_t value, StreamHandle s) override {
    const CUresult r =
        driver().wait_value64(static_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(addr), value,
                              CU_STREAM_WAIT_VALUE_GEQ);
    // The driver's codes are the runtime's for these errors (700: illegal address, ...).
    if (r != CUDA_SUCCESS)
      throw_cuda_error(static_cast<cudaError_t>(r), "cuStreamWaitValue64(lane, slot flag)",
                       GFD_SOURCE_FILE_, __LINE__);
  }
  void signal_value(std::uint64_t* addr, std::uint64_t value) override {
    std::atomic_ref<std::uint64_t>(*addr).store(value, std::memory_order_release);
  }
  void write_value(std::uint64_t* addr, std::uint64_t value, StreamHandle s) override {
    const CUresult r =
        driver().write_value64(static_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(addr), value,
                               CU_STREAM_WRITE_VALUE_DEFAULT);
    if (r != CUDA_SUCCESS)
      throw_cuda_error(static_cast<cudaError_t>(r), "cuStreamWriteValue64(lane, slot flag)",
                       GFD_SOURCE_FILE_, __LINE__);
  }
  void delay_async(std::uint32_t microseconds, StreamHandle s) override {
    GFD_CUDA_CHECK(launch_delay(microseconds, static_cast<cudaStream_t>(s)));
  }

 private:
  int ordinal_;
  std::string bus_id_;
  int prio_low_ = 0, prio_high_ = 0;
  bool host_pointers_usable_ = false;
  bool wait_value_ = false;
  // The legacy and per-thread default streams, which the batch copy calls do not take.
  static bool default_stream(StreamHandle s) {
    const auto c = static_cast<cudaStream_t>(s);
    return c == nullptr || c == cudaStreamLegacy || c == cudaStreamPerThread;
  }
  // `count` 2D copies in one cudaMemcpy3DBatchAsync; false (nothing enqueued) where the driver
  // lacks it (which then stays off) or on a default stream.
  bool batch_2d(const Copy2D* copies, std::size_t count, bool src_host, bool dst_host,
                StreamHandle s) {
    if (default_stream(s)) return false;  // rejected there, as cudaMemcpyBatchAsync
    // One op per copy: pointer operands, rows of `width` bytes at the operand's pitch (its row
    // length: one byte per element), one layer. Sources in stream order, as copy_batch.
    thread_local std::vector<cudaMemcpy3DBatchOp> ops;
    ops.assign(count, cudaMemcpy3DBatchOp{});
    const auto operand = [&](cudaMemcpy3DOperand& o, const void* p, std::size_t pitch, bool host) {
      o.type = cudaMemcpyOperandTypePointer;
      o.op.ptr.ptr = const_cast<void*>(p);
      o.op.ptr.rowLength = pitch;
      o.op.ptr.locHint.type = host ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
      o.op.ptr.locHint.id = host ? 0 : ordinal_;
    };
    for (std::size_t i = 0; i < count; ++i) {
      const Copy2D& c = copies[i];
      cudaMemcpy3DBatchOp& op = ops[i];
      operand(op.src, c.src, c.spitch, src_host);
      operand(op.dst, c.dst, c.dpitch, dst_host);
      op.extent.width = c.width;
      op.extent.height = c.rows;
      op.extent.depth = 1;
      op.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    }
    const cudaError_t e =
        cudaMemcpy3DBatchAsync(count, ops.data(), 0, static_cast<cudaStream_t>(s));
    if (e == cudaErrorNotSupported || e == cudaErrorCallRequiresNewerDriver) {
      // An older driver: one 2D copy at a time from now on.
      (void)cudaGetLastError();
      batch_3d_ = false;
      return false;
    }
    if (e != cudaSuccess) throw_cuda_error(e, "cudaMemcpy3DBatchAsync", GFD_SOURCE_FILE_, __LINE__);
    return true;
  }
  std::atomic<bool> batch_3d_{
      true};  // cudaMemcpy3DBatchAsync works here (false after cudaErrorNotSupported)
};

}  // namespace

std::shared_ptr<Device> make_cuda_device(int ordinal) {
  return std::make_shared<CudaDevice>(ordinal);
}

int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace gfd::detail
