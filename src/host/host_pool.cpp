#include "host/host_pool.hpp"

#include <cuda_runtime_api.h>
#include <numa.h>

#include <algorithm>
#include <cctype>
#include <string>

#include "gfd/error.hpp"
#include "host/host_memory.hpp"
#include "host/topology.hpp"

namespace gfd {
namespace {

void bad_option(const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "HostPool: " + what);
}

void check(const HostPoolOptions& o) {
  if (o.bytes == 0) bad_option("bytes: 0 (a pool needs at least one byte)");
  if (o.device < -1) bad_option("device: " + std::to_string(o.device) + " is below -1");
  if (o.numa_node < -2) bad_option("numa_node: " + std::to_string(o.numa_node) + " is below -2");
  if (o.numa_node >= 0 && (numa_available() < 0 || o.numa_node > numa_max_node()))
    bad_option("numa_node: " + std::to_string(o.numa_node) + " does not exist on this machine");
}

// The CUDA device a pool needs: for its GPU's locality and for registration; none otherwise.
std::shared_ptr<detail::Device> cuda_device_for(const HostPoolOptions& o) {
  check(o);
  // An unregistered pool opens no device: its locality comes from the GPU's PCI address
  // (unregistered_node), so it works on a machine without a GPU too.
  if (!o.register_memory) return nullptr;
  // Opening a device makes it current; the caller's thread keeps the device it had (a runtime's
  // torch.cuda.current_device() must not change under it).
  int previous = -1;
  const bool had = cudaGetDevice(&previous) == cudaSuccess;
  std::shared_ptr<detail::Device> d;
  try {
    d = detail::make_cuda_device(o.device >= 0 ? o.device : 0);
  } catch (const Error& e) {
    if (had) (void)cudaSetDevice(previous);
    throw Error(e.code(),
                "HostPool: registering the memory with CUDA needs device " +
                    std::to_string(std::max(o.device, 0)) +
                    " (an unregistered pool, register_memory = false, needs no GPU): " + e.what());
  }
  if (had) (void)cudaSetDevice(previous);
  return d;
}

// The NUMA node of GPU `ordinal` read from its PCI address without opening the device (no
// context); -1 where there is no such GPU, no driver, or no locality reported.
int unregistered_node(int ordinal) {
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, ordinal) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  std::string id(bus);
  std::transform(id.begin(), id.end(), id.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return detail::read_gpu_locality(id).numa_node;
}

}  // namespace

struct HostPool::Impl {
  std::shared_ptr<detail::Device> device;  // declared first: outlives the registration
  detail::HostMemory memory;
  int ordinal = -1;
};

HostPool::HostPool(const HostPoolOptions& options) : HostPool(options, cuda_device_for(options)) {}

HostPool::HostPool(std::size_t bytes, int device)
    : HostPool(HostPoolOptions{.bytes = bytes, .device = device}) {}

HostPool::HostPool(const HostPoolOptions& o, std::shared_ptr<detail::Device> device)
    : impl_(std::make_unique<Impl>()) {
  check(o);
  int node = o.numa_node;
  if (o.numa_node == -1)
    node = o.device < 0 ? -1
           : device     ? detail::read_gpu_locality(device->pci_bus_id()).numa_node
                        : unregistered_node(o.device);
  if (o.register_memory && !device)
    bad_option("register_memory: true needs a device to register the pool with");
  impl_->device = std::move(device);
  impl_->ordinal = o.device;
  // mbind before the first touch: the pages come from the GPU's node. Registration then faults
  // every page in (page-locking touches them), so there is no separate populate pass; without
  // registration the pages arrive on first touch, on the bound node.
  impl_->memory = detail::HostMemory(o.bytes, node, "HostPool");
  if (o.register_memory) {
    const detail::ScopedCurrentDevice current(*impl_->device);
    impl_->memory.register_with(*impl_->device);
  }
}

HostPool::~HostPool() = default;
HostPool::HostPool(HostPool&&) noexcept = default;
HostPool& HostPool::operator=(HostPool&&) noexcept = default;

// A moved-from pool reads as empty.
std::byte* HostPool::data() const { return impl_ ? impl_->memory.data() : nullptr; }
std::size_t HostPool::bytes() const { return impl_ ? impl_->memory.size() : 0; }
HugepageKind HostPool::hugepages() const {
  return impl_ ? impl_->memory.hugepages() : HugepageKind::kNone;
}
int HostPool::numa_node() const { return impl_ ? impl_->memory.numa_node() : -1; }
bool HostPool::registered() const { return impl_ && impl_->memory.registered(); }
int HostPool::device() const { return impl_ ? impl_->ordinal : -1; }

}  // namespace gfd
