// Pinned host staging memory for one engine: hugepage-backed where the system allows, bound to
// the GPU's NUMA node, registered with the device once for the engine's whole life.
#pragma once

#include <cstddef>

#include "device.hpp"
#include "gfd/types.hpp"
#include "host_memory.hpp"

namespace gfd::detail {

class HostStaging {
 public:
  // numa_node < 0: no binding. Throws gfd::Error when memory cannot be had or registered.
  HostStaging(Device& device, std::size_t bytes, int numa_node);
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  std::byte* data() const { return memory_.data(); }
  std::size_t size() const { return bytes_; }
  HugepageKind hugepages() const { return memory_.hugepages(); }
  bool numa_bound() const { return memory_.numa_node() >= 0; }

 private:
  HostMemory memory_;
  std::size_t bytes_ = 0;
};

}  // namespace gfd::detail
