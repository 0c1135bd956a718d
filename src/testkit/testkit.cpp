// The test-device facade over the library's internals: the device, engines over it and their
// trace, locality and the staging copy loop.
#include "testkit/testkit.hpp"

#include <numa.h>

#include <utility>

#include "device/device.hpp"
#include "engine/engine_core.hpp"
#include "gfd/error.hpp"
#include "host/gather_copy.hpp"
#include "host/host_pool.hpp"
#include "host/topology.hpp"
#include "testkit/emulated_device.hpp"

namespace gfd::testkit {

namespace {
detail::StreamHandle handle(cudaStream_t s) { return static_cast<detail::StreamHandle>(s); }
}  // namespace

int cuda_device_count() noexcept { return detail::cuda_device_count(); }

Device Device::cuda(int ordinal) {
  Device d;
  d.d_ = detail::make_cuda_device(ordinal);
  return d;
}

Device Device::emulated(int ordinal, const EmulatedOptions& options) {
  Device d;
  d.d_ = std::make_shared<detail::EmulatedDevice>(ordinal, options);
  d.emulated_ = true;
  return d;
}

int Device::ordinal() const { return d_->ordinal(); }
std::string Device::pci_bus_id() const { return d_->pci_bus_id(); }
void Device::make_current() { d_->make_current(); }
cudaStream_t Device::create_stream() { return static_cast<cudaStream_t>(d_->create_stream()); }
void Device::destroy_stream(cudaStream_t s) { d_->destroy_stream(handle(s)); }
void Device::stream_sync(cudaStream_t s) { d_->stream_sync(handle(s)); }
void* Device::alloc_device(std::size_t bytes) { return d_->alloc_device(bytes); }
void Device::free_device(void* p) { d_->free_device(p); }
void Device::register_host(void* p, std::size_t bytes) { d_->register_host(p, bytes); }
void Device::unregister_host(void* p) { d_->unregister_host(p); }
void Device::copy_h2d(void* dst, const void* src, std::size_t bytes, cudaStream_t s) {
  d_->copy_h2d(dst, src, bytes, handle(s));
}
void Device::copy_d2h(void* dst, const void* src, std::size_t bytes, cudaStream_t s) {
  d_->copy_d2h(dst, src, bytes, handle(s));
}
void Device::memset_async(void* dst, int value, std::size_t bytes, cudaStream_t s) {
  d_->memset_async(dst, value, bytes, handle(s));
}

void Device::delay_async(std::uint32_t microseconds, cudaStream_t s) {
  d_->delay_async(microseconds, handle(s));
}

const char* Device::pointer_kind(const void* p) {
  switch (d_->query_pointer(p).kind) {
    case detail::PointerKind::kPageableHost:
      return "pageable";
    case detail::PointerKind::kPinnedHost:
      return "pinned";
    case detail::PointerKind::kDevice:
      return "device";
    case detail::PointerKind::kOtherDevice:
      return "other_device";
    case detail::PointerKind::kManaged:
      return "managed";
  }
  return "unknown";
}

detail::EmulatedDevice& Device::emulator(const char* call) const {
  if (!emulated_)
    throw Error(ErrorCode::kInvalidArgument,
                std::string(call) + ": only the emulated device has it, and this device is a GPU");
  return static_cast<detail::EmulatedDevice&>(*d_);
}

void Device::adopt_device_memory(void* p, std::size_t bytes) {
  emulator("adopt_device_memory").adopt_device_memory(p, bytes);
}
void Device::release_device_memory(void* p) {
  emulator("release_device_memory").release_device_memory(p);
}
void Device::clear_fault() { emulator("clear_fault").clear_fault(); }
std::string Device::fault_message() const { return emulator("fault_message").fault_message(); }

Engine Device::make_engine(EngineOptions options, const detail::Tuning& tuning) const {
  options.device = d_->ordinal();
  return detail::EngineCore::make_engine(options, d_, tuning);
}

detail::Tuning tuning_of(const Engine& engine) { return detail::EngineCore::of(engine).tuning(); }
detail::TuningStats tuning_stats(const Engine& engine) {
  return detail::EngineCore::of(engine).tuning_stats();
}

void start_trace(Engine& engine, std::size_t capacity) {
  detail::EngineCore::of(engine).start_trace(capacity);
}

std::vector<TraceEvent> take_trace(Engine& engine) {
  return detail::EngineCore::of(engine).take_trace();
}

Locality gpu_locality(const Device& device) {
  const detail::GpuLocality loc = detail::read_gpu_locality(device.pci_bus_id());
  return Locality{loc.numa_node, loc.cpus};
}

std::vector<int> allowed_cpus() { return detail::allowed_cpus(); }

int numa_nodes() { return numa_available() < 0 ? 1 : numa_max_node() + 1; }

std::string format_cpulist(const std::vector<int>& cpus) { return detail::format_cpulist(cpus); }

bool pin_current_thread(const std::vector<int>& cpus) { return detail::pin_current_thread(cpus); }

void copy_like_staging(void* dst, const void* src, std::size_t bytes, StagingWrites writes) {
  // Resolved as the engine resolves it (kAuto, or a mode this CPU lacks, falls back).
  const detail::StoreKind kind = detail::resolve_staging_writes(writes);
  detail::copy_block(dst, src, bytes, kind);
  if (kind == detail::StoreKind::kNonTemporal) detail::store_fence();
}

void gather_like_engine(const StagedBlock* blocks, std::size_t count, void* staging,
                        StagingWrites writes) {
  // gather_ops is the gather threads' own loop (GatherToDevice::run_piece), with its default
  // prefetch; StagedBlock has the fields it reads (src, slot_offset, bytes).
  detail::gather_ops(blocks, count, static_cast<std::byte*>(staging),
                     detail::resolve_staging_writes(writes));
}

void place_like_engine(const StagedBlock* blocks, std::size_t count, const void* staging,
                       StagingWrites writes) {
  detail::scatter_ops(blocks, count, static_cast<const std::byte*>(staging),
                      detail::resolve_staging_writes(writes));
}

HostPool make_host_pool(const Device& device, const HostPoolOptions& options) {
  return detail::HostPoolAccess::make(options, device.d_);
}

}  // namespace gfd::testkit
