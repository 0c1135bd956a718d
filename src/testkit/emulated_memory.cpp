// Emulated device memory: the process-wide allocation registry, device allocations, host
// registration.
#include <sys/mman.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "gfd/error.hpp"
#include "testkit/emulated_device.hpp"

namespace gfd::detail {
namespace {

// Process-wide registry of emulated allocations, so that emulated devices of several ordinals
// recognise each other's memory (as CUDA's unified addressing does).
struct Allocation {
  std::uintptr_t end;
  PointerKind kind;  // kDevice (of `device`) or kPinnedHost
  int device;
};

std::shared_mutex& registry_mutex() {
  static std::shared_mutex m;
  return m;
}
std::map<std::uintptr_t, Allocation>& registry() {
  static std::map<std::uintptr_t, Allocation> r;
  return r;
}

}  // namespace

PointerInfo EmulatedDevice::query_pointer(const void* p) {
  const auto api = api_call();
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::shared_lock lk(registry_mutex());
  auto& r = registry();
  auto it = r.upper_bound(a);
  if (it == r.begin()) return {};
  --it;
  if (a >= it->second.end) return {};
  PointerInfo info;
  info.kind = it->second.kind;
  info.device = it->second.device;
  if (info.kind == PointerKind::kDevice && info.device != ordinal_)
    info.kind = PointerKind::kOtherDevice;
  info.begin = it->first;
  info.end = it->second.end;
  return info;
}

// Like the CUDA driver: device memory lies in address ranges reserved in whole 2 MiB units, so
// it never shares a 2 MiB region with host memory (the planner relies on that; see
// PageableCache).
namespace {
constexpr std::size_t kDeviceGranule = std::size_t{2} << 20;

std::size_t device_reservation(std::size_t bytes) {
  return (std::max<std::size_t>(bytes, 1) + kDeviceGranule - 1) / kDeviceGranule * kDeviceGranule;
}
}  // namespace

void* EmulatedDevice::alloc_device(std::size_t bytes) {
  const auto api = api_call();
  // Reserve one granule more than needed and trim to an aligned range (untouched pages cost
  // nothing).
  const std::size_t size = device_reservation(bytes);
  void* m = mmap(nullptr, size + kDeviceGranule, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) throw Error(ErrorCode::kSystem, "emulated device: out of memory");
  const auto base = reinterpret_cast<std::uintptr_t>(m);
  const std::uintptr_t a = (base + kDeviceGranule - 1) / kDeviceGranule * kDeviceGranule;
  if (a > base) munmap(m, a - base);
  if (base + kDeviceGranule > a)
    munmap(reinterpret_cast<void*>(a + size), base + kDeviceGranule - a);
  // The rest of the reservation is no accessible memory, as with the driver.
  const std::size_t used = (std::max<std::size_t>(bytes, 1) + 4095) / 4096 * 4096;
  if (used < size) mprotect(reinterpret_cast<void*>(a + used), size - used, PROT_NONE);
  std::unique_lock lk(registry_mutex());
  registry()[a] = {a + bytes, PointerKind::kDevice, ordinal_};
  return reinterpret_cast<void*>(a);
}

void EmulatedDevice::free_device(void* p) noexcept {
  if (p == nullptr) return;
  // As cudaFree does: the memory goes once every stream has run dry (work still queued may use
  // it; a process that frees its buffers with transfers in flight must not have them copy into
  // unmapped pages). With free_waits_for_device, as cuMemFree was seen to, no other call of the
  // device starts meanwhile either.
  std::unique_lock<std::shared_mutex> api;
  if (options_.free_waits_for_device) api = driver_lock();
  drain_all_streams();
  std::size_t bytes = 0;
  {
    std::unique_lock lk(registry_mutex());
    auto it = registry().find(reinterpret_cast<std::uintptr_t>(p));
    if (it == registry().end()) return;
    bytes = it->second.end - it->first;
    registry().erase(it);
  }
  munmap(p, device_reservation(bytes));
}

void EmulatedDevice::adopt_device_memory(void* p, std::size_t bytes) {
  const auto api = api_call();
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (p == nullptr || bytes == 0 || a > UINTPTR_MAX - bytes)
    throw Error(ErrorCode::kInvalidArgument, "emulated device: adopting " + std::to_string(bytes) +
                                                 " bytes at " + std::to_string(a) +
                                                 ": not a memory range");
  std::unique_lock lk(registry_mutex());
  auto& r = registry();
  auto it = r.lower_bound(a);
  const bool after = it != r.end() && it->first < a + bytes;
  const bool before = it != r.begin() && std::prev(it)->second.end > a;
  if (after || before)
    throw Error(
        ErrorCode::kInvalidArgument,
        "emulated device: the range to adopt overlaps device or pinned memory already known to it");
  r[a] = {a + bytes, PointerKind::kDevice, ordinal_};
}

void EmulatedDevice::release_device_memory(void* p) noexcept {
  // Its owner frees it next: as with free_device, the copies queued on it run first.
  drain_all_streams();
  std::unique_lock lk(registry_mutex());
  registry().erase(reinterpret_cast<std::uintptr_t>(p));
}

void EmulatedDevice::register_host(void* p, std::size_t bytes) {
  const auto api = api_call();
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::unique_lock lk(registry_mutex());
  auto& r = registry();
  auto it = r.upper_bound(a);
  if (it != r.begin() && std::prev(it)->second.end > a)
    throw Error(ErrorCode::kCuda, "emulated cudaHostRegister: range is already registered");
  r[a] = {a + bytes, PointerKind::kPinnedHost, -1};
}

void EmulatedDevice::unregister_host(void* p) noexcept {
  const auto api = api_call();
  // The memory is unmapped after this (HostPool, a runtime's pinned pool): queued copies that
  // read or write it run first.
  drain_all_streams();
  std::unique_lock lk(registry_mutex());
  registry().erase(reinterpret_cast<std::uintptr_t>(p));
}

}  // namespace gfd::detail
